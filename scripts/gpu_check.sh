#!/usr/bin/env bash
# The checks that need a CUDA device, in one run, with a short report (outputs/gpu_check/report.md):
#   bash scripts/gpu_check.sh            # on a machine with a GPU and foxhunt installed (make install TORCH='torch>=2.4')
#   PY=python3 BIN=/tmp/site/bin bash scripts/gpu_check.sh   # foxhunt installed with pip --target elsewhere
# 1. pytest -m gpu: every CUDA / NVML path (probes, the memory callback's device samples, bf16 and
#    int8 training on CUDA, CUDA allocation peaks, the ensemble streaming on CUDA, one device per job);
# 2. foxhunt memory validate on the device against rtx3050ti;
# 3. a smoke grid of the five models, registered, then foxhunt ensemble footprint on CUDA;
# 4. the training-speed sections on CUDA (scripts/benchmark.py --quick --sections rl,tft --set device=cuda:
#    every side on the GPU, the agents' compiled side with CUDA graphs; the peers' rows need
#    stable-baselines3 and pytorch-forecasting installed, else only the bare-loop rows).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
BIN=${BIN:-$(dirname "$PY")}
OUT=${OUT:-outputs/gpu_check}
mkdir -p "$OUT"
ROOT=$(mktemp -d)
report="$OUT/report.md"
{
  echo "# foxhunt GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" 2>&1
  echo '```'
} > "$report"

section() { echo; echo "## $1"; echo; echo '```'; }
# Each command is stopped after SECTION_TIMEOUT seconds (exit 124) so one hang leaves the rest of the report.
run() { timeout "${SECTION_TIMEOUT:-900}" "$@" 2>&1 | tail -n 60; echo "exit ${PIPESTATUS[0]}"; }

{ section "pytest -m gpu"; run "$PY" -m pytest -q -p no:cacheprovider -m gpu tests; echo '```'; } >> "$report"
{ section "foxhunt memory validate (CUDA, rtx3050ti)"
  (cd "$ROOT" && FOXHUNT_ROOT="$ROOT" run "$BIN/foxhunt" memory validate --predict); echo '```'; } >> "$report"
{ section "smoke grid on CUDA, register, ensemble footprint (CUDA)"
  (cd "$ROOT" && FOXHUNT_ROOT="$ROOT" run "$BIN/foxhunt-train" -m model=dqn,ppo,mamba2,tft,dlinear asset=es trainer=smoke data.source.days=7 trainer.accelerator=gpu)
  (cd "$ROOT" && FOXHUNT_ROOT="$ROOT" run "$BIN/foxhunt" ensemble register asset=es --force)  # smoke runs rarely beat the baseline: forced, tagged gate=forced
  (cd "$ROOT" && FOXHUNT_ROOT="$ROOT" run "$BIN/foxhunt" ensemble footprint asset=es data.source.days=7 ensemble.device=cuda)
  (cd "$ROOT" && FOXHUNT_ROOT="$ROOT" run "$BIN/foxhunt" ensemble replay asset=es data.source.days=7 ensemble.device=cuda ensemble.runtime=torch)
  echo '```'; } >> "$report"
{ section "training speed on CUDA (benchmark sections rl, tft)"
  run "$PY" scripts/benchmark.py --quick --sections rl,tft --set device=cuda --root "$ROOT"
  cp "$ROOT/outputs/bench/benchmark.md" "$OUT/benchmark_cuda.md" 2>/dev/null
  echo '```'; } >> "$report"
cat "$report"
