#!/usr/bin/env bash
# Every C and C++ file of the repository follows .clang-format (CONTRIBUTING.md).
# Usage: check_format.sh SOURCE_DIR CLANG_FORMAT
set -u
cd "$1" || exit 2
if [ ! -x "$2" ]; then echo "no $2: run make deps (it installs clang-format from .ci/requirements-test.txt)"; exit 1; fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  files=$(git ls-files '*.c' '*.h' '*.cpp' '*.hpp')
else
  files=$(find sdk core plugins hosts examples tests bench -name '*.c' -o -name '*.h' -o -name '*.cpp' -o -name '*.hpp')
fi
bad=0
for f in $files; do
  [ -f "$f" ] || continue
  "$2" --style=file --dry-run --Werror "$f" >/dev/null 2>&1 || { echo "not formatted: $f (fix: $2 -i $f)"; bad=1; }
done
[ $bad = 0 ] && echo "every C/C++ file follows .clang-format"
exit $bad
