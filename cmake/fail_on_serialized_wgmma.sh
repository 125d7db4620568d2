#!/usr/bin/env bash
# Compiler launcher of the sm_90a objects (CMakeLists.txt): runs the compile
# command it is given and fails it where ptxas reports that it serialized a
# kernel's warpgroup MMAs (its info C7515). ptxas does that without an error
# or a warning when code between the MMAs touches their accumulators, and the
# Hopper forward then runs up to 1.5x slower (bench/NOTES.md).
log=$(mktemp) || exit 1
"$@" 2>"$log"
status=$?
cat "$log" >&2
if grep -q "C7515" "$log"; then
  echo "error: ptxas serialized warpgroup MMAs (C7515 above); see bench/NOTES.md" >&2
  status=1
fi
rm -f "$log"
exit $status
