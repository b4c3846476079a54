# -*- Python -*-
import os
import shutil
import subprocess

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "MOE"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.moe_obj_root, "test")
# GoogleTest sources and inputs of other tests are not lit tests.
config.excludes = ["Unit", "Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]

config.substitutions.append(("%PATH%", config.environment["PATH"]))
config.substitutions.append(("%moe_src_root", config.moe_src_root))
# Runtime libraries of mlir-runner for the CPU integration tests
# (/usr/lib/llvm-22/lib/libmlir_{,c_}runner_utils.so).
mlir_lib_dir = config.mlir_lib_dir or os.path.join(os.path.dirname(config.llvm_tools_dir), "lib")
for lib in ["mlir_runner_utils", "mlir_c_runner_utils"]:
    config.substitutions.append(("%" + lib, os.path.join(mlir_lib_dir, "lib" + lib + ".so")))

llvm_config.use_default_substitutions()
llvm_config.with_system_environment(["HOME", "INCLUDE", "LIB", "TMP", "TEMP"])

# Catch captures that leak between CHECK-LABEL blocks and unused prefixes.
# moe-compile keeps kernel binaries under $MOE_MLIR_CACHE/kernels: the tests'
# own folder, not the home directory's.
config.environment["MOE_MLIR_CACHE"] = os.path.join(config.test_exec_root, "moe-mlir-cache")
config.environment["FILECHECK_OPTS"] = "-enable-var-scope --allow-unused-prefixes=false"

llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.moe_tools_dir, append_path=True)

# MOE_OPT_CHECK_IR_ROUNDTRIP=1 reruns the whole suite with every moe-opt
# invocation checking that its output re-parses to the same IR.
moe_opt_extra = []
if os.environ.get("MOE_OPT_CHECK_IR_ROUNDTRIP"):
    moe_opt_extra.append("--verify-roundtrip")

tool_dirs = [config.moe_tools_dir, config.llvm_tools_dir]
tools = [
    ToolSubst("moe-opt", extra_args=moe_opt_extra, unresolved="fatal"),
    ToolSubst("moe-reduce", unresolved="fatal"),
    ToolSubst("moe-compile", unresolved="fatal"),
    "mlir-opt",
    "mlir-runner",
    "mlir-translate",
]
llvm_config.add_tool_substitutions(tools, tool_dirs)

config.available_features.add("noasserts")
config.substitutions.append(("%PYTHON", config.python_executable))
# ptxas from PATH (scripts/test.sh puts scripts/fetch-ptxas.py's there on
# machines without CUDA), else the toolkit's.
ptxas = shutil.which("ptxas") or (
    "/usr/local/cuda/bin/ptxas" if os.path.exists("/usr/local/cuda/bin/ptxas") else None
)
if ptxas:
    config.available_features.add("ptxas")
    config.substitutions.append(("%ptxas", ptxas))
try:
    if subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0:
        config.available_features.add("cuda")
except (OSError, subprocess.TimeoutExpired):
    pass
