"""Which files of a hub repository a model needs, chosen from the repository's listing: a
checkpoint's config, tokenizer and safetensors weights, or one GGUF file (named, or picked by
llama.cpp's quantisation tag as ``llama-cli -hf org/name:Q4_K_M`` picks it).

Pure functions of the listing (the hub's, or the cache's when offline), so the same files are
chosen either way and the choice is tested without a network.
"""

from __future__ import annotations

import dataclasses
import re

INDEX_FILE = "model.safetensors.index.json"
# What a checkpoint directory is loaded from besides its weights (transformers' file names);
# ``generation_config.json`` holds the sampling defaults and extra end-of-sequence ids.
CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
TEMPLATE_FOLDER = "additional_chat_templates/"  # transformers' named chat templates
# llama.cpp's default when ``-hf`` names no tag: the first of these a file carries, then any.
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
# GGUF files in model repositories that are not the model (llama.cpp skips them the same way):
# vision projectors, importance matrices, speculative-decoding heads.
SIDECAR_MARKS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<parts>\d{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Za-z0-9_]+)$")


class HubModelError(ValueError):
    """A hub id that cannot be loaded: no such repository, no access, no such revision, no
    network, nothing cached, or no file jaxgen loads. The message says what to do; the
    ``huggingface_hub`` error behind it, if any, is the ``__cause__``."""


@dataclasses.dataclass(frozen=True)
class GGUFName:
    """A GGUF file of a listing, with what its name says (llama.cpp's naming)."""

    path: str
    tag: str  # the quantisation tag, upper case ("Q4_K_M"; "" where the name carries none)
    part: int  # 1-based part of a split file (1 of 1 for a single file)
    parts: int

    @classmethod
    def parse(cls, path: str) -> GGUFName:
        stem = path.rsplit("/", 1)[-1][: -len(".gguf")]
        part, parts = 1, 1
        split = _SPLIT.match(stem)
        if split:
            stem, part, parts = split["stem"], int(split["part"]), int(split["parts"])
        tag = _TAG.search(stem)
        return cls(path, tag[1].upper() if tag else "", part, parts)


@dataclasses.dataclass(frozen=True)
class RepoFiles:
    """The files to download. ``gguf``: the one GGUF file (nothing else is needed: its
    metadata holds the config and tokenizer). Otherwise ``metadata`` (config, tokenizer, chat
    template and the safetensors index) first, then ``weights``; ``weights`` is None where the
    index names them (read once it is downloaded)."""

    gguf: str | None = None
    metadata: tuple[str, ...] = ()
    weights: tuple[str, ...] | None = ()


def gguf_models(listing: list[str]) -> list[GGUFName]:
    """The listing's model GGUF files (sidecars such as ``mmproj`` left out), in its order."""
    names = []
    for path in listing:
        base = path.rsplit("/", 1)[-1]
        if base.lower().endswith(".gguf") and not any(m in base.lower() for m in SIDECAR_MARKS):
            names.append(GGUFName.parse(path))
    return names


def quant_tags(listing: list[str]) -> list[str]:
    """The quantisation tags the listing's GGUF files carry, sorted."""
    return sorted({name.tag for name in gguf_models(listing) if name.tag})


def choose_files(
    repo_id: str,
    listing: list[str],
    *,
    gguf_file: str | None = None,
    tag: str | None = None,
) -> RepoFiles:
    """The files of ``repo_id`` (listed in ``listing``) that loading it needs.

    Args:
        repo_id: ``org/name``, for messages.
        listing: every file path of the repository at the revision.
        gguf_file: a GGUF file of the repository to load (its path in the repository, or its
            name where only one file has it).
        tag: a quantisation tag (``Q4_K_M``, case-insensitive): the GGUF whose name carries it.

    With neither, a repository with ``config.json`` and safetensors weights loads those; one
    with only GGUF files loads llama.cpp's default pick (Q4_K_M, else Q8_0, else the first).

    Raises:
        HubModelError: no such GGUF file, no GGUF with the tag (the message lists the tags), a
            split GGUF, or neither safetensors nor GGUF in the repository.
    """
    if gguf_file is not None or tag is not None:
        return RepoFiles(gguf=choose_gguf(repo_id, listing, gguf_file=gguf_file, tag=tag))
    top = [path for path in listing if "/" not in path]
    safetensors = [path for path in top if path.endswith(".safetensors")]
    if "config.json" in top and safetensors:
        metadata = [
            path
            for path in listing
            if path in CONFIG_FILES
            or path in TOKENIZER_FILES
            or path == INDEX_FILE
            or (path.endswith(".tiktoken") and "/" not in path)
            or (path.startswith(TEMPLATE_FOLDER) and path.endswith(".jinja"))
        ]
        if INDEX_FILE in top:
            weights = None  # the shards the index names (a repository may hold other files)
        elif "model.safetensors" in top:  # transformers' single file; others are not the model
            weights = ("model.safetensors",)
        else:
            weights = tuple(safetensors)
        return RepoFiles(metadata=tuple(metadata), weights=weights)
    if gguf_models(listing):
        return RepoFiles(gguf=choose_gguf(repo_id, listing))
    shown = ", ".join(listing[:12]) + (
        f", ... ({len(listing) - 12} more)" if len(listing) > 12 else ""
    )
    missing = "config.json" if safetensors else "*.safetensors weights"
    raise HubModelError(
        f"hub repository {repo_id!r} holds neither a checkpoint jaxgen loads (config.json with "
        f"*.safetensors weights; it lacks {missing}) nor a .gguf file; it holds: {shown or 'nothing'}."
        " Pick a repository with safetensors or GGUF weights (for *.bin weights, convert them "
        "to safetensors first)"
    )


def choose_gguf(
    repo_id: str, listing: list[str], *, gguf_file: str | None = None, tag: str | None = None
) -> str:
    """The path of the GGUF file to load (see ``choose_files``)."""
    models = gguf_models(listing)
    if gguf_file is not None and tag is not None:
        raise HubModelError(
            f"give gguf_file ({gguf_file!r}) or a quantisation tag ({repo_id}:{tag}), not both"
        )
    if gguf_file is not None:
        found = [p for p in listing if p == gguf_file]
        found = found or [p for p in listing if p.rsplit("/", 1)[-1] == gguf_file]
        if len(found) != 1:
            files = [name.path for name in models]
            what = "several files named" if found else "no file"
            raise HubModelError(
                f"hub repository {repo_id!r} has {what} {gguf_file!r} (gguf_file / --gguf-file); "
                f"its GGUF files: {', '.join(files) or 'none'}"
            )
        chosen = GGUFName.parse(found[0])
        if not chosen.path.lower().endswith(".gguf"):
            raise HubModelError(f"gguf_file {gguf_file!r} of {repo_id!r} is not a .gguf file")
        return _single_file(repo_id, chosen, listing)
    if not models:
        raise HubModelError(f"hub repository {repo_id!r} has no .gguf file to match tag {tag!r}")
    for wanted in [tag] if tag is not None else DEFAULT_TAGS:
        pattern = re.compile(rf"(?<![A-Za-z0-9]){re.escape(wanted)}[.-]", re.IGNORECASE)
        matches = [name for name in models if pattern.search(name.path.rsplit("/", 1)[-1])]
        if matches:
            # A single file before the first part of a split one; llama.cpp takes the first.
            matches.sort(key=lambda name: (name.parts > 1, name.part))
            return _single_file(repo_id, matches[0], listing)
    if tag is not None:
        raise HubModelError(
            f"no GGUF file of hub repository {repo_id!r} carries the quantisation tag {tag!r}; "
            f"its tags: {', '.join(quant_tags(listing)) or 'none (give --gguf-file)'}"
        )
    return _single_file(repo_id, min(models, key=lambda name: name.parts > 1), listing)


def _single_file(repo_id: str, name: GGUFName, listing: list[str]) -> str:
    if name.parts == 1:
        return name.path
    singles = sorted({m.tag or m.path for m in gguf_models(listing) if m.parts == 1})
    raise HubModelError(
        f"{name.path!r} of hub repository {repo_id!r} is a GGUF split into {name.parts} parts; "
        "jaxgen loads single-file GGUFs: merge the parts with llama.cpp's "
        "`llama-gguf-split --merge` and load the merged file by its path"
        + (f", or pick a single-file quantisation: {', '.join(singles)}" if singles else "")
    )
