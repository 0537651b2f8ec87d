"""What jaxgen's own tokenizers (``PlainTokenizer``, ``GGUFTokenizer``) share of transformers'
tokenizer surface, written once over the few methods each defines: ``encode``, ``decode``,
``convert_tokens_to_ids``, ``to_transformers``, and the ``special_tokens_map`` and
``chat_template`` attributes."""

from __future__ import annotations

from jaxgen.loaders.chat_template import render_chat_template, select_template


class TokenizerMethods:
    """Calls, batch decoding, special-token lists, chat templates and saving, as transformers'
    ``PreTrainedTokenizerFast`` has them."""

    def __bool__(self) -> bool:
        return True

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys(self.special_tokens_map.values()))

    @property
    def all_special_ids(self) -> list[int]:
        return [self.convert_tokens_to_ids(token) for token in self.all_special_tokens]

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict:
        """``{"input_ids": ..., "attention_mask": ...}`` for a text or a list of texts."""
        if isinstance(text, str):
            ids = self.encode(text, add_special_tokens=add_special_tokens)
            return {"input_ids": ids, "attention_mask": [1] * len(ids)}
        ids = [self.encode(t, add_special_tokens=add_special_tokens) for t in text]
        return {"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids]}

    def batch_decode(self, sequences: list[list[int]], skip_special_tokens: bool = False):
        return [self.decode(ids, skip_special_tokens=skip_special_tokens) for ids in sequences]

    # -- chat ----------------------------------------------------------------------------------
    def get_chat_template(self, chat_template: str | None = None, tools=None) -> str:
        return select_template(self.chat_template, chat_template, tools)

    def apply_chat_template(
        self,
        conversation: list[dict],
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        tokenize: bool = True,
        return_dict: bool = False,
        **kwargs,
    ) -> str | list[int] | dict:
        """The conversation's prompt text (``tokenize=False``) or its ids (the template's
        special tokens parsed, nothing added); ``kwargs`` are extra template variables (over
        the special tokens)."""
        text = render_chat_template(
            self.get_chat_template(chat_template, tools),
            conversation,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **{**self.special_tokens_map, **kwargs},
        )
        if not tokenize:
            return text
        ids = self.encode(text, add_special_tokens=False)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)} if return_dict else ids

    def save_pretrained(self, directory: str, **kwargs):
        """Writes ``tokenizer.json`` and its config as transformers writes them."""
        return self.to_transformers().save_pretrained(directory, **kwargs)
