#!/bin/sh
# The testbed hosts' OCI runtime (each host dockerd's default runtime, installed as
# simgpu-runtime beside simgpu_runtime.py). Only runc's `create` and `run` may need the GPU hook
# put into the bundle (simgpu_runtime.py, the Python wrapper); every other call (state, start,
# exec, kill, delete: most of the calls a container's life makes) goes straight to runc with
# its arguments unchanged, which is what the Python wrapper did for them too (its docstring:
# the bundle is changed on create only). A Python start per call cost about 20 ms of CPU,
# some 2,500 times in a run of the test suite.
# An argument that merely equals "create" or "run" (an option's value) takes the Python path,
# which parses runc's arguments exactly and changes nothing for any other command.
for arg in "$@"; do
  case $arg in
    create|run) exec /usr/bin/python3 -S "$(dirname "$0")/simgpu_runtime.py" "$@" ;;
  esac
done
exec "${SIMGPU_RUNC:-/usr/sbin/runc}" "$@"
