"""Checks that a manifest's gpu_limits are the contract's limits (test/moe-compile/gpu-limits.mlir).

check_gpu_limits.py NAME.json gpu_contract.json
"""

import json
import sys

with open(sys.argv[1], encoding="utf-8") as f:
    manifest = json.load(f)
with open(sys.argv[2], encoding="utf-8") as f:
    contract = json.load(f)
limits = manifest.get("gpu_limits")
if limits != contract["limits"]:
    print(f"gpu_limits differ from the contract's limits:\n{limits}\n{contract['limits']}")
    sys.exit(1)
if manifest.get("chip") != contract["chip"]:
    print(f"chip {manifest.get('chip')!r} is not the contract's {contract['chip']!r}")
    sys.exit(1)
print(f"gpu_limits: {len(limits)} limits, as gpu_contract.json gives them")
