#!/bin/sh
# Interestingness test that hangs on every candidate without @router and finds
# the others interesting: moe-reduce must give each run a time limit.
grep -q "func.func @router" "$1" || sleep 300
exit 1
