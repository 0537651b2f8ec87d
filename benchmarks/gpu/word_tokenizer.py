"""A tokenizer made on the spot (nothing can be downloaded on the device): one word per id,
``<unk>``, ``<s>`` and ``</s>`` first, then ``w3 w4 ...``; a transformers fast tokenizer, so
jaxgen's loaders, detokenizers and grammar compiler take it like any checkpoint's."""

from __future__ import annotations

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")


def word_tokenizer(vocab_size: int):
    """A ``PreTrainedTokenizerFast`` of ``vocab_size`` ids (bos 1, eos 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece()  # words joined by spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def random_prompts(rng, count: int, lengths, vocab_size: int) -> list[list[int]]:
    """``count`` prompts of random ordinary ids (no special token); ``lengths`` is one length
    for all or one per prompt."""
    if isinstance(lengths, int):
        lengths = [lengths] * count
    low = len(SPECIAL_TOKENS)
    return [rng.integers(low, vocab_size, int(n)).tolist() for n in lengths]
