#!/bin/sh
# Interestingness test for reduce.mlir: the candidate ($1) is interesting when
# moe-generate-backward still rejects it because it holds a moe.layer. Exit 1
# means interesting to mlirReduceMain, exit 0 means not.
if moe-opt "$1" --moe-generate-backward -o /dev/null 2>&1 |
    grep -q "must be decomposed first"; then
  exit 1
fi
exit 0
