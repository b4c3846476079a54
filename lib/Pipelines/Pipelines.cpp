//===- Pipelines.cpp - moe-mlir pass pipelines --------------*- C++ -*-===//

#include "moe/Pipelines/Pipelines.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;
using namespace mlir::moe;

void mlir::moe::buildMoETrainingPipeline(
    OpPassManager &pm, const MoETrainingPipelineOptions &options) {
  (void)options; // Read by the planning and GPU stages once they exist.
  pm.addPass(createMoEDecompose());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
}

void mlir::moe::registerMoEPipelines() {
  PassPipelineRegistration<MoETrainingPipelineOptions>(
      "moe-training-pipeline",
      "Compile a forward moe layer for training (decomposition today; "
      "backward, activation planning and sm_90a kernels follow)",
      buildMoETrainingPipeline);
}
