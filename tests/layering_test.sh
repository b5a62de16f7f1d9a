#!/bin/bash
# Each argument is a genquery's output (its BUILD file says what it
# asks): the targets that break the layering (a device kind reached around
# the factory, gRPC reached from the runtime, a device reached from the
# operators' device-neutral definition), which must be none.
status=0
for result in "$@"; do
  if [[ -s "$result" ]]; then
    echo "FAIL: $(basename "$result") lists targets that must not be there:"
    cat "$result"
    status=1
  else
    echo "ok: $(basename "$result") is empty"
  fi
done
exit $status
