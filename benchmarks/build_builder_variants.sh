#!/usr/bin/env bash
# Build SmolLM2-135M-Instruct with onnxruntime-genai's model builder under each builder option
# that tests/integration/test_builder_variants.py checks (issue 6.4).
#
# Usage: bash benchmarks/build_builder_variants.sh [HF_DIR] [OUT_DIR] [VARIANT...]
#   HF_DIR   HF folder made by /work/shared/recipes/build_smollm2.sh
#            (default ~/genai-models/hf/smollm2-135m-instruct)
#   OUT_DIR  where the model folders go (default ~/genai-models/onnx/issue6)
#   VARIANT  names from the table below (default: all); an existing folder is kept.
# Needs the build venv (onnxruntime-genai 0.18.0 + torch + transformers): BUILD_VENV
# (default ~/genai-models/venv). Each int4 build takes 1-3 min on 2 cores.
set -euo pipefail
HF=${1:-$HOME/genai-models/hf/smollm2-135m-instruct}
OUT=${2:-$HOME/genai-models/onnx/issue6}
shift $(( $# > 2 ? 2 : $# )) || true
VENV=${BUILD_VENV:-$HOME/genai-models/venv}
[ -d "$HF" ] || { echo "no HF folder at $HF (run /work/shared/recipes/build_smollm2.sh)"; exit 2; }
# shellcheck disable=SC1091
. "$VENV/bin/activate"

# name | precision | extra options (comma-separated key=value, as the builder takes them)
VARIANTS=(
  "int4-prune-lm-head|int4|prune_lm_head=true"
  "int4-hidden-states|int4|include_hidden_states=true"
  "int4-exclude-embeds|int4|exclude_embeds=true"
  "int4-exclude-lm-head|int4|exclude_lm_head=true"
  "int4-shared-embeddings|int4|shared_embeddings=true"
  "int4-accuracy-level-4|int4|int4_accuracy_level=4"
  "int4-kquant|int4|algo_config=k_quant"
  "int4-4layers|int4|num_hidden_layers=4"
  "int8|int8|"
  "fp32-prune-lm-head|fp32|prune_lm_head=true"
)
want=("$@")
mkdir -p "$OUT"
for row in "${VARIANTS[@]}"; do
  IFS='|' read -r name precision extra <<<"$row"
  if [ ${#want[@]} -gt 0 ] && [[ ! " ${want[*]} " =~ \ $name\  ]]; then continue; fi
  dest="$OUT/smollm2-135m-instruct-$name"
  if [ -f "$dest/genai_config.json" ]; then echo "$name: exists ($dest)"; continue; fi
  args=(-i "$HF" -o "$dest" -p "$precision" -e cpu -c "$OUT/cache_dir")
  [ -n "$extra" ] && args+=(--extra_options ${extra//,/ })
  echo "$name: building ($precision ${extra:-no extra options})"
  start=$(date +%s)
  if python -m onnxruntime_genai.models.builder "${args[@]}" > "$OUT/$name.log" 2>&1; then
    echo "$name: ok in $(( $(date +%s) - start )) s"
  else
    echo "$name: builder failed (see $OUT/$name.log)"; rm -rf "$dest"
  fi
done
rm -rf "$OUT/cache_dir"
