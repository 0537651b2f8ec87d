"""The LoRA adapters a server offers under their names (``--lora-modules name=path``, vLLM's
``/v1/load_lora_adapter``): each name is an OpenAI ``model`` a request may ask for, served by
the base model with that adapter (``jaxgen.lora.LoRARequest``)."""

from __future__ import annotations

from jaxgen.lora import LoRARequest
from serving.settings.parsers import SettingsError


def parse_lora_modules(value, source: str = "the command line") -> tuple[tuple[str, str], ...]:
    """``name=path`` items (a list, or one string of them separated by spaces or commas) as
    ``(name, path)`` pairs. Raises ``SettingsError`` naming ``source``."""
    if value is None:
        return ()
    items = value.replace(",", " ").split() if isinstance(value, str) else list(value)
    pairs = []
    for item in items:
        name, _, path = str(item).partition("=")
        if not name or not path:
            raise SettingsError(f"lora_modules from {source} must be name=path, got {item!r}")
        pairs.append((name, path))
    if len({name for name, _ in pairs}) != len(pairs):
        raise SettingsError(f"lora_modules from {source} names an adapter twice")
    return tuple(pairs)


class LoRAAdapters:
    """Adapter names -> ``LoRARequest`` (ids given in order, from 1)."""

    def __init__(self, modules: tuple[tuple[str, str], ...] = ()):
        self.by_name: dict[str, LoRARequest] = {}
        self._next_id = 1
        for name, path in modules:
            self.new(name, path)

    def new(self, name: str, path: str) -> LoRARequest:
        """A request for a new adapter (not yet offered: ``offer`` it once it is loaded).
        ``ValueError`` if the name is taken."""
        if name in self.by_name:
            raise ValueError(f"lora_name {name!r} is already loaded")
        request = LoRARequest(name, self._next_id, path)
        self._next_id += 1
        self.by_name[name] = request
        return request

    def get(self, name) -> LoRARequest | None:
        return self.by_name.get(name) if isinstance(name, str) else None

    def remove(self, name: str) -> None:
        self.by_name.pop(name, None)

    def cards(self, parent: str, created: int) -> list[dict]:
        """``/v1/models`` entries of the adapters, each naming its base model as ``parent``."""
        return [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "jaxgen",
                "root": request.lora_path,
                "parent": parent,
            }
            for name, request in self.by_name.items()
        ]


def register_lora_modules(engine, modules: tuple[tuple[str, str], ...]) -> LoRAAdapters:
    """Reads and checks every ``--lora-modules`` adapter into ``engine`` at start-up (a bad one
    ends the command with its message). Returns them by name."""
    adapters = LoRAAdapters(modules)
    if adapters.by_name and getattr(engine, "lora", None) is None:
        raise SettingsError("--lora-modules needs --enable-lora")
    for request in adapters.by_name.values():
        try:
            engine.add_lora(request)
        except ValueError as error:
            raise SettingsError(f"--lora-modules: {error}") from None
    return adapters
