//===- MoECPULibrary.mlir - reference kernels of the CPU path -------------===//
//
// The kernels `convert-moe-to-linalg` calls, one per moe op (docs/cpu-path.md
// sections 1 and 2), plus the helpers they share. The conversion copies the
// ones a module uses into it as private functions. Everything is f32 (i32 for
// indices) with dynamic shapes; loops are plain scf.for over tensors, which is
// slow but easy to read and to check against the NumPy reference.
//
// Notation: T tokens, d hidden, E experts, k experts per token, R = T * k rows,
// G gate/up width (2n for swiglu, n otherwise), n expert FFN width, m shared
// FFN width. `scoring`: 0 softmax, 1 sigmoid. `act`: 0 swiglu, 1 gelu, 2 silu,
// 3 gelu_tanh.
//
//===----------------------------------------------------------------------===//

#map_id = affine_map<(i, j) -> (i, j)>
#map_nt_a = affine_map<(m, n, k) -> (m, k)>
#map_nt_b = affine_map<(m, n, k) -> (n, k)>
#map_tn_a = affine_map<(m, n, k) -> (k, m)>
#map_tn_b = affine_map<(m, n, k) -> (k, n)>
#map_out = affine_map<(m, n, k) -> (m, n)>

//===----------------------------------------------------------------------===//
// Scalar helpers
//===----------------------------------------------------------------------===//

func.func @__moe_cpu_sigmoid(%v: f32) -> f32 {
  %one = arith.constant 1.0 : f32
  %neg = arith.negf %v : f32
  %e = math.exp %neg : f32
  %den = arith.addf %one, %e : f32
  %r = arith.divf %one, %den : f32
  return %r : f32
}

// silu(v) = v * sigmoid(v)
func.func @__moe_cpu_silu(%v: f32) -> f32 {
  %s = func.call @__moe_cpu_sigmoid(%v) : (f32) -> f32
  %r = arith.mulf %v, %s : f32
  return %r : f32
}

// silu'(v) = s * (1 + v * (1 - s)), s = sigmoid(v)
func.func @__moe_cpu_dsilu(%v: f32) -> f32 {
  %one = arith.constant 1.0 : f32
  %s = func.call @__moe_cpu_sigmoid(%v) : (f32) -> f32
  %oms = arith.subf %one, %s : f32
  %t = arith.mulf %v, %oms : f32
  %u = arith.addf %one, %t : f32
  %r = arith.mulf %s, %u : f32
  return %r : f32
}

// gelu(v) = v / 2 * (1 + erf(v / sqrt(2)))
func.func @__moe_cpu_gelu(%v: f32) -> f32 {
  %one = arith.constant 1.0 : f32
  %two = arith.constant 2.0 : f32
  %sqrt2 = arith.constant 1.41421354 : f32
  %half = arith.divf %v, %two : f32
  %z = arith.divf %v, %sqrt2 : f32
  %erf = math.erf %z : f32
  %p = arith.addf %one, %erf : f32
  %r = arith.mulf %half, %p : f32
  return %r : f32
}

// gelu'(v) = (1 + erf(v / sqrt(2))) / 2 + v * exp(-v^2 / 2) / sqrt(2 pi)
func.func @__moe_cpu_dgelu(%v: f32) -> f32 {
  %one = arith.constant 1.0 : f32
  %two = arith.constant 2.0 : f32
  %sqrt2 = arith.constant 1.41421354 : f32
  %inv_sqrt2pi = arith.constant 0.398942292 : f32
  %z = arith.divf %v, %sqrt2 : f32
  %erf = math.erf %z : f32
  %p = arith.addf %one, %erf : f32
  %cdf = arith.divf %p, %two : f32
  %sq = arith.mulf %v, %v : f32
  %hsq = arith.divf %sq, %two : f32
  %nhsq = arith.negf %hsq : f32
  %e = math.exp %nhsq : f32
  %pdf = arith.mulf %e, %inv_sqrt2pi : f32
  %vp = arith.mulf %v, %pdf : f32
  %r = arith.addf %cdf, %vp : f32
  return %r : f32
}

// The selection order: `v` beats the current best `best` when it is not NaN
// and the best is NaN or `v` is strictly greater.
func.func @__moe_cpu_beats(%v: f32, %best: f32) -> i1 {
  %v_nan = arith.cmpf uno, %v, %v : f32
  %best_nan = arith.cmpf uno, %best, %best : f32
  %gt = arith.cmpf ogt, %v, %best : f32
  %either = arith.ori %best_nan, %gt : i1
  %true = arith.constant true
  %v_num = arith.xori %v_nan, %true : i1
  %r = arith.andi %v_num, %either : i1
  return %r : i1
}

func.func @__moe_cpu_index_to_f32(%i: index) -> f32 {
  %i64 = arith.index_cast %i : index to i64
  %f = arith.sitofp %i64 : i64 to f32
  return %f : f32
}

//===----------------------------------------------------------------------===//
// Tensor helpers
//===----------------------------------------------------------------------===//

func.func @__moe_cpu_zeros(%rows: index, %cols: index) -> tensor<?x?xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty(%rows, %cols) : tensor<?x?xf32>
  %z = linalg.fill ins(%zero : f32) outs(%e : tensor<?x?xf32>) -> tensor<?x?xf32>
  return %z : tensor<?x?xf32>
}

// a [M, K] . b [K, N]
func.func @__moe_cpu_mm(%a: tensor<?x?xf32>, %b: tensor<?x?xf32>)
    -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %m = tensor.dim %a, %c0 : tensor<?x?xf32>
  %n = tensor.dim %b, %c1 : tensor<?x?xf32>
  %z = func.call @__moe_cpu_zeros(%m, %n) : (index, index) -> tensor<?x?xf32>
  %r = linalg.matmul ins(%a, %b : tensor<?x?xf32>, tensor<?x?xf32>)
                     outs(%z : tensor<?x?xf32>) -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}

// a [M, K] . b^T, b [N, K]
func.func @__moe_cpu_mm_nt(%a: tensor<?x?xf32>, %b: tensor<?x?xf32>)
    -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %m = tensor.dim %a, %c0 : tensor<?x?xf32>
  %n = tensor.dim %b, %c0 : tensor<?x?xf32>
  %z = func.call @__moe_cpu_zeros(%m, %n) : (index, index) -> tensor<?x?xf32>
  %r = linalg.generic {
      indexing_maps = [#map_nt_a, #map_nt_b, #map_out],
      iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%a, %b : tensor<?x?xf32>, tensor<?x?xf32>)
      outs(%z : tensor<?x?xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  } -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}

// a^T . b, a [K, M], b [K, N]
func.func @__moe_cpu_mm_tn(%a: tensor<?x?xf32>, %b: tensor<?x?xf32>)
    -> tensor<?x?xf32> {
  %c1 = arith.constant 1 : index
  %m = tensor.dim %a, %c1 : tensor<?x?xf32>
  %n = tensor.dim %b, %c1 : tensor<?x?xf32>
  %z = func.call @__moe_cpu_zeros(%m, %n) : (index, index) -> tensor<?x?xf32>
  %r = linalg.generic {
      indexing_maps = [#map_tn_a, #map_tn_b, #map_out],
      iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%a, %b : tensor<?x?xf32>, tensor<?x?xf32>)
      outs(%z : tensor<?x?xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  } -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}

// Row-wise softmax with the row maximum subtracted.
func.func @__moe_cpu_softmax(%l: tensor<?x?xf32>) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %t_n = tensor.dim %l, %c0 : tensor<?x?xf32>
  %e_n = tensor.dim %l, %c1 : tensor<?x?xf32>
  %init = tensor.empty(%t_n, %e_n) : tensor<?x?xf32>
  %r = scf.for %t = %c0 to %t_n step %c1 iter_args(%acc = %init)
      -> (tensor<?x?xf32>) {
    %mx = scf.for %e = %c0 to %e_n step %c1 iter_args(%m = %ninf) -> (f32) {
      %v = tensor.extract %l[%t, %e] : tensor<?x?xf32>
      %m2 = arith.maximumf %m, %v : f32
      scf.yield %m2 : f32
    }
    %sum = scf.for %e = %c0 to %e_n step %c1 iter_args(%s = %zero) -> (f32) {
      %v = tensor.extract %l[%t, %e] : tensor<?x?xf32>
      %d = arith.subf %v, %mx : f32
      %x = math.exp %d : f32
      %s2 = arith.addf %s, %x : f32
      scf.yield %s2 : f32
    }
    %row = scf.for %e = %c0 to %e_n step %c1 iter_args(%a = %acc)
        -> (tensor<?x?xf32>) {
      %v = tensor.extract %l[%t, %e] : tensor<?x?xf32>
      %d = arith.subf %v, %mx : f32
      %x = math.exp %d : f32
      %p = arith.divf %x, %sum : f32
      %a2 = tensor.insert %p into %a[%t, %e] : tensor<?x?xf32>
      scf.yield %a2 : tensor<?x?xf32>
    }
    scf.yield %row : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

func.func @__moe_cpu_sigmoid_all(%l: tensor<?x?xf32>) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %t_n = tensor.dim %l, %c0 : tensor<?x?xf32>
  %e_n = tensor.dim %l, %c1 : tensor<?x?xf32>
  %init = tensor.empty(%t_n, %e_n) : tensor<?x?xf32>
  %r = linalg.generic {
      indexing_maps = [#map_id, #map_id],
      iterator_types = ["parallel", "parallel"]}
      ins(%l : tensor<?x?xf32>) outs(%init : tensor<?x?xf32>) {
  ^bb0(%v: f32, %o: f32):
    %s = func.call @__moe_cpu_sigmoid(%v) : (f32) -> f32
    linalg.yield %s : f32
  } -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}

// Router scores: softmax (scoring 0) or sigmoid (scoring 1) of the logits.
func.func @__moe_cpu_scores(%l: tensor<?x?xf32>, %scoring: i32)
    -> tensor<?x?xf32> {
  %c0_i32 = arith.constant 0 : i32
  %is_softmax = arith.cmpi eq, %scoring, %c0_i32 : i32
  %r = scf.if %is_softmax -> (tensor<?x?xf32>) {
    %s = func.call @__moe_cpu_softmax(%l)
        : (tensor<?x?xf32>) -> tensor<?x?xf32>
    scf.yield %s : tensor<?x?xf32>
  } else {
    %s = func.call @__moe_cpu_sigmoid_all(%l)
        : (tensor<?x?xf32>) -> tensor<?x?xf32>
    scf.yield %s : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

// Auxiliary-loss probabilities: softmax, or sigmoid normalised per token.
func.func @__moe_cpu_aux_probs(%l: tensor<?x?xf32>, %scoring: i32)
    -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %c0_i32 = arith.constant 0 : i32
  %is_softmax = arith.cmpi eq, %scoring, %c0_i32 : i32
  %r = scf.if %is_softmax -> (tensor<?x?xf32>) {
    %s = func.call @__moe_cpu_softmax(%l)
        : (tensor<?x?xf32>) -> tensor<?x?xf32>
    scf.yield %s : tensor<?x?xf32>
  } else {
    %sig = func.call @__moe_cpu_sigmoid_all(%l)
        : (tensor<?x?xf32>) -> tensor<?x?xf32>
    %t_n = tensor.dim %l, %c0 : tensor<?x?xf32>
    %e_n = tensor.dim %l, %c1 : tensor<?x?xf32>
    %init = tensor.empty(%t_n, %e_n) : tensor<?x?xf32>
    %p = scf.for %t = %c0 to %t_n step %c1 iter_args(%acc = %init)
        -> (tensor<?x?xf32>) {
      %sum = scf.for %e = %c0 to %e_n step %c1 iter_args(%s = %zero) -> (f32) {
        %v = tensor.extract %sig[%t, %e] : tensor<?x?xf32>
        %s2 = arith.addf %s, %v : f32
        scf.yield %s2 : f32
      }
      %row = scf.for %e = %c0 to %e_n step %c1 iter_args(%a = %acc)
          -> (tensor<?x?xf32>) {
        %v = tensor.extract %sig[%t, %e] : tensor<?x?xf32>
        %q = arith.divf %v, %sum : f32
        %a2 = tensor.insert %q into %a[%t, %e] : tensor<?x?xf32>
        scf.yield %a2 : tensor<?x?xf32>
      }
      scf.yield %row : tensor<?x?xf32>
    }
    scf.yield %p : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

// logsumexp of row t: max + log(sum(exp(l - max))).
func.func @__moe_cpu_lse(%l: tensor<?x?xf32>, %t: index) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant 0xFF800000 : f32
  %e_n = tensor.dim %l, %c1 : tensor<?x?xf32>
  %mx = scf.for %e = %c0 to %e_n step %c1 iter_args(%m = %ninf) -> (f32) {
    %v = tensor.extract %l[%t, %e] : tensor<?x?xf32>
    %m2 = arith.maximumf %m, %v : f32
    scf.yield %m2 : f32
  }
  %sum = scf.for %e = %c0 to %e_n step %c1 iter_args(%s = %zero) -> (f32) {
    %v = tensor.extract %l[%t, %e] : tensor<?x?xf32>
    %d = arith.subf %v, %mx : f32
    %x = math.exp %d : f32
    %s2 = arith.addf %s, %x : f32
    scf.yield %s2 : f32
  }
  %log = math.log %sum : f32
  %r = arith.addf %mx, %log : f32
  return %r : f32
}

// Selections per expert [E] (f32): (t, j) pairs whose expert is in [0, E).
func.func @__moe_cpu_expert_counts(%experts: tensor<?x?xi32>, %e_n: index)
    -> tensor<?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %t_n = tensor.dim %experts, %c0 : tensor<?x?xi32>
  %k = tensor.dim %experts, %c1 : tensor<?x?xi32>
  %e_n_i64 = arith.index_cast %e_n : index to i64
  %empty = tensor.empty(%e_n) : tensor<?xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<?xf32>)
      -> tensor<?xf32>
  %r = scf.for %t = %c0 to %t_n step %c1 iter_args(%acc = %init)
      -> (tensor<?xf32>) {
    %row = scf.for %j = %c0 to %k step %c1 iter_args(%a = %acc)
        -> (tensor<?xf32>) {
      %e32 = tensor.extract %experts[%t, %j] : tensor<?x?xi32>
      %e64 = arith.extsi %e32 : i32 to i64
      %c0_i64 = arith.constant 0 : i64
      %ge = arith.cmpi sge, %e64, %c0_i64 : i64
      %lt = arith.cmpi slt, %e64, %e_n_i64 : i64
      %ok = arith.andi %ge, %lt : i1
      %a2 = scf.if %ok -> (tensor<?xf32>) {
        %e = arith.index_cast %e64 : i64 to index
        %old = tensor.extract %a[%e] : tensor<?xf32>
        %new = arith.addf %old, %one : f32
        %a3 = tensor.insert %new into %a[%e] : tensor<?xf32>
        scf.yield %a3 : tensor<?xf32>
      } else {
        scf.yield %a : tensor<?xf32>
      }
      scf.yield %a2 : tensor<?xf32>
    }
    scf.yield %row : tensor<?xf32>
  }
  return %r : tensor<?xf32>
}

// gelu_tanh(v) = v / 2 * (1 + tanh(sqrt(2 / pi) * (v + 0.044715 v^3))), as
// torch's gelu(approximate="tanh") computes it.
func.func @__moe_cpu_gelu_tanh(%v: f32) -> f32 {
  %one = arith.constant 1.0 : f32
  %half = arith.constant 0.5 : f32
  %beta = arith.constant 0.797884583 : f32
  %kappa = arith.constant 0.0447149985 : f32
  %sq = arith.mulf %v, %v : f32
  %cube = arith.mulf %sq, %v : f32
  %kc = arith.mulf %kappa, %cube : f32
  %sum = arith.addf %v, %kc : f32
  %inner = arith.mulf %beta, %sum : f32
  %t = math.tanh %inner : f32
  %p = arith.addf %one, %t : f32
  %hv = arith.mulf %half, %v : f32
  %r = arith.mulf %hv, %p : f32
  return %r : f32
}

// gelu_tanh'(v) = (1 + t) / 2 + v / 2 * (1 - t^2) * sqrt(2 / pi)
// * (1 + 3 * 0.044715 v^2), t = tanh(sqrt(2 / pi) * (v + 0.044715 v^3)).
func.func @__moe_cpu_dgelu_tanh(%v: f32) -> f32 {
  %one = arith.constant 1.0 : f32
  %half = arith.constant 0.5 : f32
  %three = arith.constant 3.0 : f32
  %beta = arith.constant 0.797884583 : f32
  %kappa = arith.constant 0.0447149985 : f32
  %sq = arith.mulf %v, %v : f32
  %cube = arith.mulf %sq, %v : f32
  %kc = arith.mulf %kappa, %cube : f32
  %sum = arith.addf %v, %kc : f32
  %inner = arith.mulf %beta, %sum : f32
  %t = math.tanh %inner : f32
  %p = arith.addf %one, %t : f32
  %left_d = arith.mulf %half, %p : f32
  %hv = arith.mulf %half, %v : f32
  %t2 = arith.mulf %t, %t : f32
  %sech2 = arith.subf %one, %t2 : f32
  %k3 = arith.mulf %three, %kappa : f32
  %k3sq = arith.mulf %k3, %sq : f32
  %dinner0 = arith.addf %one, %k3sq : f32
  %dinner = arith.mulf %beta, %dinner0 : f32
  %a = arith.mulf %hv, %sech2 : f32
  %right_d = arith.mulf %a, %dinner : f32
  %r = arith.addf %left_d, %right_d : f32
  return %r : f32
}

// act(h) [R, n] from the pre-activations h [R, G].
func.func @__moe_cpu_act(%h: tensor<?x?xf32>, %n: index, %act: i32)
    -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c0_i32 = arith.constant 0 : i32
  %c1_i32 = arith.constant 1 : i32
  %c3_i32 = arith.constant 3 : i32
  %rows = tensor.dim %h, %c0 : tensor<?x?xf32>
  %init = tensor.empty(%rows, %n) : tensor<?x?xf32>
  %g = tensor.extract_slice %h[0, 0] [%rows, %n] [1, 1]
      : tensor<?x?xf32> to tensor<?x?xf32>
  %is_swiglu = arith.cmpi eq, %act, %c0_i32 : i32
  %is_gelu = arith.cmpi eq, %act, %c1_i32 : i32
  %is_gelu_tanh = arith.cmpi eq, %act, %c3_i32 : i32
  %r = scf.if %is_swiglu -> (tensor<?x?xf32>) {
    %u = tensor.extract_slice %h[0, %n] [%rows, %n] [1, 1]
        : tensor<?x?xf32> to tensor<?x?xf32>
    %a = linalg.generic {
        indexing_maps = [#map_id, #map_id, #map_id],
        iterator_types = ["parallel", "parallel"]}
        ins(%g, %u : tensor<?x?xf32>, tensor<?x?xf32>)
        outs(%init : tensor<?x?xf32>) {
    ^bb0(%gv: f32, %uv: f32, %o: f32):
      %s = func.call @__moe_cpu_silu(%gv) : (f32) -> f32
      %p = arith.mulf %s, %uv : f32
      linalg.yield %p : f32
    } -> tensor<?x?xf32>
    scf.yield %a : tensor<?x?xf32>
  } else {
    %a = scf.if %is_gelu -> (tensor<?x?xf32>) {
      %b = linalg.generic {
          indexing_maps = [#map_id, #map_id],
          iterator_types = ["parallel", "parallel"]}
          ins(%g : tensor<?x?xf32>) outs(%init : tensor<?x?xf32>) {
      ^bb0(%v: f32, %o: f32):
        %s = func.call @__moe_cpu_gelu(%v) : (f32) -> f32
        linalg.yield %s : f32
      } -> tensor<?x?xf32>
      scf.yield %b : tensor<?x?xf32>
    } else {
      %b = scf.if %is_gelu_tanh -> (tensor<?x?xf32>) {
        %c = linalg.generic {
            indexing_maps = [#map_id, #map_id],
            iterator_types = ["parallel", "parallel"]}
            ins(%g : tensor<?x?xf32>) outs(%init : tensor<?x?xf32>) {
        ^bb0(%v: f32, %o: f32):
          %s = func.call @__moe_cpu_gelu_tanh(%v) : (f32) -> f32
          linalg.yield %s : f32
        } -> tensor<?x?xf32>
        scf.yield %c : tensor<?x?xf32>
      } else {
        %c = linalg.generic {
            indexing_maps = [#map_id, #map_id],
            iterator_types = ["parallel", "parallel"]}
            ins(%g : tensor<?x?xf32>) outs(%init : tensor<?x?xf32>) {
        ^bb0(%v: f32, %o: f32):
          %s = func.call @__moe_cpu_silu(%v) : (f32) -> f32
          linalg.yield %s : f32
        } -> tensor<?x?xf32>
        scf.yield %c : tensor<?x?xf32>
      }
      scf.yield %b : tensor<?x?xf32>
    }
    scf.yield %a : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

// dh [R, G] from h [R, G] and the gradient of act(h), da [R, n].
func.func @__moe_cpu_act_grad(%h: tensor<?x?xf32>, %da: tensor<?x?xf32>,
                              %act: i32) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c0_i32 = arith.constant 0 : i32
  %c1_i32 = arith.constant 1 : i32
  %c3_i32 = arith.constant 3 : i32
  %rows = tensor.dim %h, %c0 : tensor<?x?xf32>
  %width = tensor.dim %h, %c1 : tensor<?x?xf32>
  %n = tensor.dim %da, %c1 : tensor<?x?xf32>
  %init = tensor.empty(%rows, %n) : tensor<?x?xf32>
  %g = tensor.extract_slice %h[0, 0] [%rows, %n] [1, 1]
      : tensor<?x?xf32> to tensor<?x?xf32>
  %is_swiglu = arith.cmpi eq, %act, %c0_i32 : i32
  %is_gelu = arith.cmpi eq, %act, %c1_i32 : i32
  %is_gelu_tanh = arith.cmpi eq, %act, %c3_i32 : i32
  %r = scf.if %is_swiglu -> (tensor<?x?xf32>) {
    // One generic over [R, 2n] (no insert_slice, whose strided copy would
    // need a runtime library): column c < n is dg, column n + c is du.
    %full = tensor.empty(%rows, %width) : tensor<?x?xf32>
    %dh = linalg.generic {
        indexing_maps = [#map_id],
        iterator_types = ["parallel", "parallel"]}
        outs(%full : tensor<?x?xf32>) {
    ^bb0(%o: f32):
      %row = linalg.index 0 : index
      %col = linalg.index 1 : index
      %is_gate = arith.cmpi ult, %col, %n : index
      %col_up = arith.subi %col, %n : index
      %c = arith.select %is_gate, %col, %col_up : index
      %c_up = arith.addi %c, %n : index
      %gv = tensor.extract %h[%row, %c] : tensor<?x?xf32>
      %uv = tensor.extract %h[%row, %c_up] : tensor<?x?xf32>
      %dav = tensor.extract %da[%row, %c] : tensor<?x?xf32>
      %ds = func.call @__moe_cpu_dsilu(%gv) : (f32) -> f32
      %s = func.call @__moe_cpu_silu(%gv) : (f32) -> f32
      %dau = arith.mulf %dav, %uv : f32
      %dgv = arith.mulf %dau, %ds : f32
      %duv = arith.mulf %dav, %s : f32
      %v = arith.select %is_gate, %dgv, %duv : f32
      linalg.yield %v : f32
    } -> tensor<?x?xf32>
    scf.yield %dh : tensor<?x?xf32>
  } else {
    %a = scf.if %is_gelu -> (tensor<?x?xf32>) {
      %b = linalg.generic {
          indexing_maps = [#map_id, #map_id, #map_id],
          iterator_types = ["parallel", "parallel"]}
          ins(%g, %da : tensor<?x?xf32>, tensor<?x?xf32>)
          outs(%init : tensor<?x?xf32>) {
      ^bb0(%v: f32, %dav: f32, %o: f32):
        %d = func.call @__moe_cpu_dgelu(%v) : (f32) -> f32
        %p = arith.mulf %dav, %d : f32
        linalg.yield %p : f32
      } -> tensor<?x?xf32>
      scf.yield %b : tensor<?x?xf32>
    } else {
      %b = scf.if %is_gelu_tanh -> (tensor<?x?xf32>) {
        %c = linalg.generic {
            indexing_maps = [#map_id, #map_id, #map_id],
            iterator_types = ["parallel", "parallel"]}
            ins(%g, %da : tensor<?x?xf32>, tensor<?x?xf32>)
            outs(%init : tensor<?x?xf32>) {
        ^bb0(%v: f32, %dav: f32, %o: f32):
          %d = func.call @__moe_cpu_dgelu_tanh(%v) : (f32) -> f32
          %p = arith.mulf %dav, %d : f32
          linalg.yield %p : f32
        } -> tensor<?x?xf32>
        scf.yield %c : tensor<?x?xf32>
      } else {
        %c = linalg.generic {
            indexing_maps = [#map_id, #map_id, #map_id],
            iterator_types = ["parallel", "parallel"]}
            ins(%g, %da : tensor<?x?xf32>, tensor<?x?xf32>)
            outs(%init : tensor<?x?xf32>) {
        ^bb0(%v: f32, %dav: f32, %o: f32):
          %d = func.call @__moe_cpu_dsilu(%v) : (f32) -> f32
          %p = arith.mulf %dav, %d : f32
          linalg.yield %p : f32
        } -> tensor<?x?xf32>
        scf.yield %c : tensor<?x?xf32>
      }
      scf.yield %b : tensor<?x?xf32>
    }
    scf.yield %a : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

// The expert that owns each row [R] (i32), -1 for unused rows.
func.func @__moe_cpu_row_experts(%offsets: tensor<?xi32>, %r_n: index)
    -> tensor<?xi32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %m1 = arith.constant -1 : i32
  %offs_n = tensor.dim %offsets, %c0 : tensor<?xi32>
  %e_n = arith.subi %offs_n, %c1 : index
  %empty = tensor.empty(%r_n) : tensor<?xi32>
  %init = linalg.fill ins(%m1 : i32) outs(%empty : tensor<?xi32>)
      -> tensor<?xi32>
  %r = scf.for %e = %c0 to %e_n step %c1 iter_args(%acc = %init)
      -> (tensor<?xi32>) {
    %e1 = arith.addi %e, %c1 : index
    %lo32 = tensor.extract %offsets[%e] : tensor<?xi32>
    %hi32 = tensor.extract %offsets[%e1] : tensor<?xi32>
    %lo = arith.index_cast %lo32 : i32 to index
    %hi = arith.index_cast %hi32 : i32 to index
    %e32 = arith.index_cast %e : index to i32
    %row = scf.for %rr = %lo to %hi step %c1 iter_args(%a = %acc)
        -> (tensor<?xi32>) {
      %a2 = tensor.insert %e32 into %a[%rr] : tensor<?xi32>
      scf.yield %a2 : tensor<?xi32>
    }
    scf.yield %row : tensor<?xi32>
  }
  return %r : tensor<?xi32>
}

//===----------------------------------------------------------------------===//
// Router
//===----------------------------------------------------------------------===//

func.func @__moe_cpu_router(%x: tensor<?x?xf32>, %wr: tensor<?x?xf32>,
                            %bias: tensor<?xf32>, %scoring: i32, %k: index,
                            %renormalize: i1, %num_groups: index,
                            %topk_groups: index, %scaling: f32,
                            %round_bf16: i1)
    -> (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %zero = arith.constant 0.0 : f32
  %true = arith.constant true
  %false = arith.constant false
  %lacc = func.call @__moe_cpu_mm(%x, %wr)
      : (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<?x?xf32>
  // round_logits on bf16 activations: the logits as a bf16 nn.Linear has them.
  %logits = scf.if %round_bf16 -> (tensor<?x?xf32>) {
    %rounded = linalg.generic {
        indexing_maps = [#map_id, #map_id],
        iterator_types = ["parallel", "parallel"]}
        ins(%lacc : tensor<?x?xf32>) outs(%lacc : tensor<?x?xf32>) {
    ^bb0(%v: f32, %o: f32):
      // Round to nearest even on the bits (arith.truncf to bf16 would call
      // compiler-rt's __truncsfbf2, which the CPU runner does not link);
      // NaN stays NaN.
      %bits = arith.bitcast %v : f32 to i32
      %c16 = arith.constant 16 : i32
      %c1i = arith.constant 1 : i32
      %half = arith.constant 32767 : i32
      %mask = arith.constant -65536 : i32
      %hi = arith.shrui %bits, %c16 : i32
      %lsb = arith.andi %hi, %c1i : i32
      %rbias = arith.addi %half, %lsb : i32
      %rsum = arith.addi %bits, %rbias : i32
      %kept = arith.andi %rsum, %mask : i32
      %rounded_v = arith.bitcast %kept : i32 to f32
      %nan = arith.cmpf uno, %v, %v : f32
      %r = arith.select %nan, %v, %rounded_v : f32
      linalg.yield %r : f32
    } -> tensor<?x?xf32>
    scf.yield %rounded : tensor<?x?xf32>
  } else {
    scf.yield %lacc : tensor<?x?xf32>
  }
  %s = func.call @__moe_cpu_scores(%logits, %scoring)
      : (tensor<?x?xf32>, i32) -> tensor<?x?xf32>
  %t_n = tensor.dim %x, %c0 : tensor<?x?xf32>
  %e_n = tensor.dim %wr, %c1 : tensor<?x?xf32>
  %grouped = arith.cmpi ugt, %num_groups, %c1 : index
  %gsize = arith.divui %e_n, %num_groups : index

  // Selection scores c = s + bias.
  %c_init = tensor.empty(%t_n, %e_n) : tensor<?x?xf32>
  %c = linalg.generic {
      indexing_maps = [#map_id, affine_map<(i, j) -> (j)>, #map_id],
      iterator_types = ["parallel", "parallel"]}
      ins(%s, %bias : tensor<?x?xf32>, tensor<?xf32>)
      outs(%c_init : tensor<?x?xf32>) {
  ^bb0(%sv: f32, %bv: f32, %o: f32):
    %sum = arith.addf %sv, %bv : f32
    linalg.yield %sum : f32
  } -> tensor<?x?xf32>

  // avail[t, e]: e may still be picked for token t.
  %avail_empty = tensor.empty(%t_n, %e_n) : tensor<?x?xi1>
  %avail_all = linalg.fill ins(%true : i1) outs(%avail_empty : tensor<?x?xi1>)
      -> tensor<?x?xi1>
  %gtaken_empty = tensor.empty(%t_n, %num_groups) : tensor<?x?xi1>
  %gtaken_init = linalg.fill ins(%false : i1)
      outs(%gtaken_empty : tensor<?x?xi1>) -> tensor<?x?xi1>
  %gscore_init = func.call @__moe_cpu_zeros(%t_n, %num_groups)
      : (index, index) -> tensor<?x?xf32>

  %w_init = func.call @__moe_cpu_zeros(%t_n, %k)
      : (index, index) -> tensor<?x?xf32>
  %ex_init = tensor.empty(%t_n, %k) : tensor<?x?xi32>

  %res:5 = scf.for %t = %c0 to %t_n step %c1
      iter_args(%avail = %avail_all, %gtaken = %gtaken_init,
                %gscore = %gscore_init, %w = %w_init, %ex = %ex_init)
      -> (tensor<?x?xi1>, tensor<?x?xi1>, tensor<?x?xf32>, tensor<?x?xf32>,
          tensor<?x?xi32>) {
    // Group-limited candidates.
    %g:3 = scf.if %grouped
        -> (tensor<?x?xi1>, tensor<?x?xi1>, tensor<?x?xf32>) {
      // Group scores: the sum of the two best c (the best when gsize == 1).
      %gs2 = scf.for %gi = %c0 to %num_groups step %c1
          iter_args(%gsa = %gscore) -> (tensor<?x?xf32>) {
        %lo = arith.muli %gi, %gsize : index
        %hi = arith.addi %lo, %gsize : index
        %v0 = tensor.extract %c[%t, %lo] : tensor<?x?xf32>
        %lo1 = arith.addi %lo, %c1 : index
        %b1:2 = scf.for %e = %lo1 to %hi step %c1
            iter_args(%bi = %lo, %bv = %v0) -> (index, f32) {
          %v = tensor.extract %c[%t, %e] : tensor<?x?xf32>
          %better = func.call @__moe_cpu_beats(%v, %bv) : (f32, f32) -> i1
          %bi2 = arith.select %better, %e, %bi : index
          %bv2 = arith.select %better, %v, %bv : f32
          scf.yield %bi2, %bv2 : index, f32
        }
        %two = arith.cmpi uge, %gsize, %c2 : index
        %score = scf.if %two -> (f32) {
          %b2:3 = scf.for %e = %lo to %hi step %c1
              iter_args(%found = %false, %bi = %lo, %bv = %zero)
              -> (i1, index, f32) {
            %v = tensor.extract %c[%t, %e] : tensor<?x?xf32>
            %better = func.call @__moe_cpu_beats(%v, %bv) : (f32, f32) -> i1
            %notfound = arith.xori %found, %true : i1
            %take0 = arith.ori %notfound, %better : i1
            %other = arith.cmpi ne, %e, %b1#0 : index
            %take = arith.andi %take0, %other : i1
            %bi2 = arith.select %take, %e, %bi : index
            %bv2 = arith.select %take, %v, %bv : f32
            %found2 = arith.ori %found, %take : i1
            scf.yield %found2, %bi2, %bv2 : i1, index, f32
          }
          %sum = arith.addf %b1#1, %b2#2 : f32
          scf.yield %sum : f32
        } else {
          scf.yield %b1#1 : f32
        }
        %gsa2 = tensor.insert %score into %gsa[%t, %gi] : tensor<?x?xf32>
        scf.yield %gsa2 : tensor<?x?xf32>
      }
      // The topk_groups best groups.
      %gt2 = scf.for %round = %c0 to %topk_groups step %c1
          iter_args(%gta = %gtaken) -> (tensor<?x?xi1>) {
        %pick:3 = scf.for %gi = %c0 to %num_groups step %c1
            iter_args(%found = %false, %bi = %c0, %bv = %zero)
            -> (i1, index, f32) {
          %taken = tensor.extract %gta[%t, %gi] : tensor<?x?xi1>
          %v = tensor.extract %gs2[%t, %gi] : tensor<?x?xf32>
          %better = func.call @__moe_cpu_beats(%v, %bv) : (f32, f32) -> i1
          %notfound = arith.xori %found, %true : i1
          %take0 = arith.ori %notfound, %better : i1
          %free = arith.xori %taken, %true : i1
          %take = arith.andi %take0, %free : i1
          %bi2 = arith.select %take, %gi, %bi : index
          %bv2 = arith.select %take, %v, %bv : f32
          %found2 = arith.ori %found, %take : i1
          scf.yield %found2, %bi2, %bv2 : i1, index, f32
        }
        %gta2 = scf.if %pick#0 -> (tensor<?x?xi1>) {
          %gta3 = tensor.insert %true into %gta[%t, %pick#1]
              : tensor<?x?xi1>
          scf.yield %gta3 : tensor<?x?xi1>
        } else {
          scf.yield %gta : tensor<?x?xi1>
        }
        scf.yield %gta2 : tensor<?x?xi1>
      }
      // Only the experts of those groups stay candidates.
      %av2 = scf.for %e = %c0 to %e_n step %c1 iter_args(%ava = %avail)
          -> (tensor<?x?xi1>) {
        %gi = arith.divui %e, %gsize : index
        %in = arith.cmpi ult, %gi, %num_groups : index
        %gic = arith.select %in, %gi, %c0 : index
        %taken = tensor.extract %gt2[%t, %gic] : tensor<?x?xi1>
        %keep = arith.andi %taken, %in : i1
        %ava2 = tensor.insert %keep into %ava[%t, %e] : tensor<?x?xi1>
        scf.yield %ava2 : tensor<?x?xi1>
      }
      scf.yield %av2, %gt2, %gs2
          : tensor<?x?xi1>, tensor<?x?xi1>, tensor<?x?xf32>
    } else {
      scf.yield %avail, %gtaken, %gscore
          : tensor<?x?xi1>, tensor<?x?xi1>, tensor<?x?xf32>
    }

    // k rounds: the best remaining candidate.
    %sel:2 = scf.for %j = %c0 to %k step %c1
        iter_args(%ava = %g#0, %exa = %ex)
        -> (tensor<?x?xi1>, tensor<?x?xi32>) {
      %pick:3 = scf.for %e = %c0 to %e_n step %c1
          iter_args(%found = %false, %bi = %c0, %bv = %zero)
          -> (i1, index, f32) {
        %ok = tensor.extract %ava[%t, %e] : tensor<?x?xi1>
        %v = tensor.extract %c[%t, %e] : tensor<?x?xf32>
        %better = func.call @__moe_cpu_beats(%v, %bv) : (f32, f32) -> i1
        %notfound = arith.xori %found, %true : i1
        %take0 = arith.ori %notfound, %better : i1
        %take = arith.andi %take0, %ok : i1
        %bi2 = arith.select %take, %e, %bi : index
        %bv2 = arith.select %take, %v, %bv : f32
        %found2 = arith.ori %found, %take : i1
        scf.yield %found2, %bi2, %bv2 : i1, index, f32
      }
      %ava2 = tensor.insert %false into %ava[%t, %pick#1] : tensor<?x?xi1>
      %e32 = arith.index_cast %pick#1 : index to i32
      %exa2 = tensor.insert %e32 into %exa[%t, %j] : tensor<?x?xi32>
      scf.yield %ava2, %exa2 : tensor<?x?xi1>, tensor<?x?xi32>
    }

    // Weights: the scores of the picks, renormalised, scaled.
    %sum = scf.for %j = %c0 to %k step %c1 iter_args(%acc = %zero) -> (f32) {
      %e32 = tensor.extract %sel#1[%t, %j] : tensor<?x?xi32>
      %e = arith.index_cast %e32 : i32 to index
      %v = tensor.extract %s[%t, %e] : tensor<?x?xf32>
      %acc2 = arith.addf %acc, %v : f32
      scf.yield %acc2 : f32
    }
    %nonzero = arith.cmpf une, %sum, %zero : f32
    %divide = arith.andi %renormalize, %nonzero : i1
    %w2 = scf.for %j = %c0 to %k step %c1 iter_args(%wa = %w)
        -> (tensor<?x?xf32>) {
      %e32 = tensor.extract %sel#1[%t, %j] : tensor<?x?xi32>
      %e = arith.index_cast %e32 : i32 to index
      %v = tensor.extract %s[%t, %e] : tensor<?x?xf32>
      %q = arith.divf %v, %sum : f32
      %v2 = arith.select %divide, %q, %v : f32
      %v3 = arith.mulf %v2, %scaling : f32
      %wa2 = tensor.insert %v3 into %wa[%t, %j] : tensor<?x?xf32>
      scf.yield %wa2 : tensor<?x?xf32>
    }
    scf.yield %sel#0, %g#1, %g#2, %w2, %sel#1
        : tensor<?x?xi1>, tensor<?x?xi1>, tensor<?x?xf32>, tensor<?x?xf32>,
          tensor<?x?xi32>
  }
  return %res#3, %res#4, %logits
      : tensor<?x?xf32>, tensor<?x?xi32>, tensor<?x?xf32>
}

func.func @__moe_cpu_router_grad(%x: tensor<?x?xf32>, %wr: tensor<?x?xf32>,
                                 %logits: tensor<?x?xf32>,
                                 %experts: tensor<?x?xi32>,
                                 %d_weights: tensor<?x?xf32>,
                                 %d_logits: tensor<?x?xf32>, %scoring: i32,
                                 %renormalize: i1, %scaling: f32)
    -> (tensor<?x?xf32>, tensor<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %c0_i32 = arith.constant 0 : i32
  %s = func.call @__moe_cpu_scores(%logits, %scoring)
      : (tensor<?x?xf32>, i32) -> tensor<?x?xf32>
  %t_n = tensor.dim %logits, %c0 : tensor<?x?xf32>
  %e_n = tensor.dim %logits, %c1 : tensor<?x?xf32>
  %k = tensor.dim %experts, %c1 : tensor<?x?xi32>
  %e_n_i32 = arith.index_cast %e_n : index to i32
  %is_softmax = arith.cmpi eq, %scoring, %c0_i32 : i32
  %ds_init = func.call @__moe_cpu_zeros(%t_n, %e_n)
      : (index, index) -> tensor<?x?xf32>
  %dl_init = tensor.empty(%t_n, %e_n) : tensor<?x?xf32>
  %res:2 = scf.for %t = %c0 to %t_n step %c1
      iter_args(%ds = %ds_init, %dl = %dl_init)
      -> (tensor<?x?xf32>, tensor<?x?xf32>) {
    // S = sum_j u_j and D = sum_j dw_j * u_j over the valid picks.
    %sums:2 = scf.for %j = %c0 to %k step %c1
        iter_args(%sa = %zero, %da = %zero) -> (f32, f32) {
      %e32 = tensor.extract %experts[%t, %j] : tensor<?x?xi32>
      %ge = arith.cmpi sge, %e32, %c0_i32 : i32
      %lt = arith.cmpi slt, %e32, %e_n_i32 : i32
      %ok = arith.andi %ge, %lt : i1
      %r:2 = scf.if %ok -> (f32, f32) {
        %e = arith.index_cast %e32 : i32 to index
        %u = tensor.extract %s[%t, %e] : tensor<?x?xf32>
        %dw = tensor.extract %d_weights[%t, %j] : tensor<?x?xf32>
        %sa2 = arith.addf %sa, %u : f32
        %p = arith.mulf %dw, %u : f32
        %da2 = arith.addf %da, %p : f32
        scf.yield %sa2, %da2 : f32, f32
      } else {
        scf.yield %sa, %da : f32, f32
      }
      scf.yield %r#0, %r#1 : f32, f32
    }
    %nonzero = arith.cmpf une, %sums#0, %zero : f32
    %ss = arith.mulf %sums#0, %sums#0 : f32
    %corr = arith.divf %sums#1, %ss : f32
    %ds2 = scf.for %j = %c0 to %k step %c1 iter_args(%dsa = %ds)
        -> (tensor<?x?xf32>) {
      %e32 = tensor.extract %experts[%t, %j] : tensor<?x?xi32>
      %ge = arith.cmpi sge, %e32, %c0_i32 : i32
      %lt = arith.cmpi slt, %e32, %e_n_i32 : i32
      %ok = arith.andi %ge, %lt : i1
      %dsa2 = scf.if %ok -> (tensor<?x?xf32>) {
        %e = arith.index_cast %e32 : i32 to index
        %dw = tensor.extract %d_weights[%t, %j] : tensor<?x?xf32>
        %du = scf.if %renormalize -> (f32) {
          %q = arith.divf %dw, %sums#0 : f32
          %diff = arith.subf %q, %corr : f32
          %v = arith.mulf %scaling, %diff : f32
          %v2 = arith.select %nonzero, %v, %zero : f32
          scf.yield %v2 : f32
        } else {
          %v = arith.mulf %scaling, %dw : f32
          scf.yield %v : f32
        }
        %dsa3 = tensor.insert %du into %dsa[%t, %e] : tensor<?x?xf32>
        scf.yield %dsa3 : tensor<?x?xf32>
      } else {
        scf.yield %dsa : tensor<?x?xf32>
      }
      scf.yield %dsa2 : tensor<?x?xf32>
    }
    // <ds, s> for softmax.
    %dot = scf.for %e = %c0 to %e_n step %c1 iter_args(%acc = %zero) -> (f32) {
      %dsv = tensor.extract %ds2[%t, %e] : tensor<?x?xf32>
      %sv = tensor.extract %s[%t, %e] : tensor<?x?xf32>
      %p = arith.mulf %dsv, %sv : f32
      %acc2 = arith.addf %acc, %p : f32
      scf.yield %acc2 : f32
    }
    %dl2 = scf.for %e = %c0 to %e_n step %c1 iter_args(%dla = %dl)
        -> (tensor<?x?xf32>) {
      %dsv = tensor.extract %ds2[%t, %e] : tensor<?x?xf32>
      %sv = tensor.extract %s[%t, %e] : tensor<?x?xf32>
      %diff = arith.subf %dsv, %dot : f32
      %soft = arith.mulf %sv, %diff : f32
      %oms = arith.subf %one, %sv : f32
      %p = arith.mulf %dsv, %sv : f32
      %sig = arith.mulf %p, %oms : f32
      %v = arith.select %is_softmax, %soft, %sig : f32
      %extra = tensor.extract %d_logits[%t, %e] : tensor<?x?xf32>
      %v2 = arith.addf %v, %extra : f32
      %dla2 = tensor.insert %v2 into %dla[%t, %e] : tensor<?x?xf32>
      scf.yield %dla2 : tensor<?x?xf32>
    }
    scf.yield %ds2, %dl2 : tensor<?x?xf32>, tensor<?x?xf32>
  }
  %dx = func.call @__moe_cpu_mm_nt(%res#1, %wr)
      : (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<?x?xf32>
  %dwr = func.call @__moe_cpu_mm_tn(%x, %res#1)
      : (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<?x?xf32>
  return %dx, %dwr : tensor<?x?xf32>, tensor<?x?xf32>
}

//===----------------------------------------------------------------------===//
// Dispatch
//===----------------------------------------------------------------------===//

func.func @__moe_cpu_dispatch(%experts: tensor<?x?xi32>, %e_n: index,
                              %capacity: index)
    -> (tensor<?xi32>, tensor<?xi32>, tensor<?x?xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c0_i32 = arith.constant 0 : i32
  %c1_i32 = arith.constant 1 : i32
  %m1 = arith.constant -1 : i32
  %t_n = tensor.dim %experts, %c0 : tensor<?x?xi32>
  %k = tensor.dim %experts, %c1 : tensor<?x?xi32>
  %r_n = arith.muli %t_n, %k : index
  %e_n1 = arith.addi %e_n, %c1 : index
  %e_n_i64 = arith.index_cast %e_n : index to i64
  %cap_i64 = arith.index_cast %capacity : index to i64

  %ids_empty = tensor.empty(%r_n) : tensor<?xi32>
  %ids_init = linalg.fill ins(%c0_i32 : i32) outs(%ids_empty : tensor<?xi32>)
      -> tensor<?xi32>
  %cnt_empty = tensor.empty(%e_n) : tensor<?xi32>
  %cnt_init = linalg.fill ins(%c0_i32 : i32) outs(%cnt_empty : tensor<?xi32>)
      -> tensor<?xi32>
  %rows_init = tensor.empty(%t_n, %k) : tensor<?x?xi32>

  // Pass 1: the index of each kept pair among its expert's kept pairs.
  %p1:2 = scf.for %t = %c0 to %t_n step %c1
      iter_args(%cnt = %cnt_init, %rows = %rows_init)
      -> (tensor<?xi32>, tensor<?x?xi32>) {
    %row:2 = scf.for %j = %c0 to %k step %c1
        iter_args(%cnta = %cnt, %rowsa = %rows)
        -> (tensor<?xi32>, tensor<?x?xi32>) {
      %e32 = tensor.extract %experts[%t, %j] : tensor<?x?xi32>
      %e64 = arith.extsi %e32 : i32 to i64
      %c0_i64 = arith.constant 0 : i64
      %ge = arith.cmpi sge, %e64, %c0_i64 : i64
      %lt = arith.cmpi slt, %e64, %e_n_i64 : i64
      %ok = arith.andi %ge, %lt : i1
      %r:2 = scf.if %ok -> (tensor<?xi32>, tensor<?x?xi32>) {
        %e = arith.index_cast %e64 : i64 to index
        %n32 = tensor.extract %cnta[%e] : tensor<?xi32>
        %n64 = arith.extsi %n32 : i32 to i64
        %room = arith.cmpi slt, %n64, %cap_i64 : i64
        %q:2 = scf.if %room -> (tensor<?xi32>, tensor<?x?xi32>) {
          %n2 = arith.addi %n32, %c1_i32 : i32
          %cnta2 = tensor.insert %n2 into %cnta[%e] : tensor<?xi32>
          %rowsa2 = tensor.insert %n32 into %rowsa[%t, %j] : tensor<?x?xi32>
          scf.yield %cnta2, %rowsa2 : tensor<?xi32>, tensor<?x?xi32>
        } else {
          %rowsa2 = tensor.insert %m1 into %rowsa[%t, %j] : tensor<?x?xi32>
          scf.yield %cnta, %rowsa2 : tensor<?xi32>, tensor<?x?xi32>
        }
        scf.yield %q#0, %q#1 : tensor<?xi32>, tensor<?x?xi32>
      } else {
        %rowsa2 = tensor.insert %m1 into %rowsa[%t, %j] : tensor<?x?xi32>
        scf.yield %cnta, %rowsa2 : tensor<?xi32>, tensor<?x?xi32>
      }
      scf.yield %r#0, %r#1 : tensor<?xi32>, tensor<?x?xi32>
    }
    scf.yield %row#0, %row#1 : tensor<?xi32>, tensor<?x?xi32>
  }

  // offsets[e + 1] = offsets[e] + kept[e].
  %offs_empty = tensor.empty(%e_n1) : tensor<?xi32>
  %offs0 = tensor.insert %c0_i32 into %offs_empty[%c0] : tensor<?xi32>
  %offs:2 = scf.for %e = %c0 to %e_n step %c1
      iter_args(%o = %offs0, %run = %c0_i32) -> (tensor<?xi32>, i32) {
    %n32 = tensor.extract %p1#0[%e] : tensor<?xi32>
    %run2 = arith.addi %run, %n32 : i32
    %e1 = arith.addi %e, %c1 : index
    %o2 = tensor.insert %run2 into %o[%e1] : tensor<?xi32>
    scf.yield %o2, %run2 : tensor<?xi32>, i32
  }

  // Pass 2: global rows and token ids.
  %p2:2 = scf.for %t = %c0 to %t_n step %c1
      iter_args(%ids = %ids_init, %rows = %p1#1)
      -> (tensor<?xi32>, tensor<?x?xi32>) {
    %t32 = arith.index_cast %t : index to i32
    %row:2 = scf.for %j = %c0 to %k step %c1
        iter_args(%idsa = %ids, %rowsa = %rows)
        -> (tensor<?xi32>, tensor<?x?xi32>) {
      %local = tensor.extract %rowsa[%t, %j] : tensor<?x?xi32>
      %kept = arith.cmpi sge, %local, %c0_i32 : i32
      %r:2 = scf.if %kept -> (tensor<?xi32>, tensor<?x?xi32>) {
        %e32 = tensor.extract %experts[%t, %j] : tensor<?x?xi32>
        %e = arith.index_cast %e32 : i32 to index
        %base = tensor.extract %offs#0[%e] : tensor<?xi32>
        %g32 = arith.addi %base, %local : i32
        %g = arith.index_cast %g32 : i32 to index
        %idsa2 = tensor.insert %t32 into %idsa[%g] : tensor<?xi32>
        %rowsa2 = tensor.insert %g32 into %rowsa[%t, %j] : tensor<?x?xi32>
        scf.yield %idsa2, %rowsa2 : tensor<?xi32>, tensor<?x?xi32>
      } else {
        scf.yield %idsa, %rowsa : tensor<?xi32>, tensor<?x?xi32>
      }
      scf.yield %r#0, %r#1 : tensor<?xi32>, tensor<?x?xi32>
    }
    scf.yield %row#0, %row#1 : tensor<?xi32>, tensor<?x?xi32>
  }
  return %p2#0, %offs#0, %p2#1
      : tensor<?xi32>, tensor<?xi32>, tensor<?x?xi32>
}

//===----------------------------------------------------------------------===//
// Routed experts
//===----------------------------------------------------------------------===//

// The biases b_gate_up [E, G] and b_down [E, d] start each dot product (zeros
// for a layer without biases, which leaves the sums as they were).
func.func @__moe_cpu_expert_ffn(%x: tensor<?x?xf32>, %token_ids: tensor<?xi32>,
                                %offsets: tensor<?xi32>,
                                %wgu: tensor<?x?x?xf32>,
                                %wd: tensor<?x?x?xf32>,
                                %bgu: tensor<?x?xf32>, %bd: tensor<?x?xf32>,
                                %act: i32)
    -> (tensor<?x?xf32>, tensor<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %zero = arith.constant 0.0 : f32
  %r_n = tensor.dim %token_ids, %c0 : tensor<?xi32>
  %e_n = tensor.dim %wgu, %c0 : tensor<?x?x?xf32>
  %d = tensor.dim %x, %c1 : tensor<?x?xf32>
  %g_n = tensor.dim %wgu, %c2 : tensor<?x?x?xf32>
  %n = tensor.dim %wd, %c1 : tensor<?x?x?xf32>
  %h_init = func.call @__moe_cpu_zeros(%r_n, %g_n)
      : (index, index) -> tensor<?x?xf32>
  %h = scf.for %e = %c0 to %e_n step %c1 iter_args(%ha = %h_init)
      -> (tensor<?x?xf32>) {
    %e1 = arith.addi %e, %c1 : index
    %lo32 = tensor.extract %offsets[%e] : tensor<?xi32>
    %hi32 = tensor.extract %offsets[%e1] : tensor<?xi32>
    %lo = arith.index_cast %lo32 : i32 to index
    %hi = arith.index_cast %hi32 : i32 to index
    %he = scf.for %r = %lo to %hi step %c1 iter_args(%hb = %ha)
        -> (tensor<?x?xf32>) {
      %t32 = tensor.extract %token_ids[%r] : tensor<?xi32>
      %t = arith.index_cast %t32 : i32 to index
      %hr = scf.for %col = %c0 to %g_n step %c1 iter_args(%hc = %hb)
          -> (tensor<?x?xf32>) {
        %bv = tensor.extract %bgu[%e, %col] : tensor<?x?xf32>
        %dot = scf.for %i = %c0 to %d step %c1 iter_args(%acc = %bv)
            -> (f32) {
          %xv = tensor.extract %x[%t, %i] : tensor<?x?xf32>
          %wv = tensor.extract %wgu[%e, %i, %col] : tensor<?x?x?xf32>
          %p = arith.mulf %xv, %wv : f32
          %acc2 = arith.addf %acc, %p : f32
          scf.yield %acc2 : f32
        }
        %hc2 = tensor.insert %dot into %hc[%r, %col] : tensor<?x?xf32>
        scf.yield %hc2 : tensor<?x?xf32>
      }
      scf.yield %hr : tensor<?x?xf32>
    }
    scf.yield %he : tensor<?x?xf32>
  }
  %a = func.call @__moe_cpu_act(%h, %n, %act)
      : (tensor<?x?xf32>, index, i32) -> tensor<?x?xf32>
  %y_init = func.call @__moe_cpu_zeros(%r_n, %d)
      : (index, index) -> tensor<?x?xf32>
  %y = scf.for %e = %c0 to %e_n step %c1 iter_args(%ya = %y_init)
      -> (tensor<?x?xf32>) {
    %e1 = arith.addi %e, %c1 : index
    %lo32 = tensor.extract %offsets[%e] : tensor<?xi32>
    %hi32 = tensor.extract %offsets[%e1] : tensor<?xi32>
    %lo = arith.index_cast %lo32 : i32 to index
    %hi = arith.index_cast %hi32 : i32 to index
    %ye = scf.for %r = %lo to %hi step %c1 iter_args(%yb = %ya)
        -> (tensor<?x?xf32>) {
      %yr = scf.for %o = %c0 to %d step %c1 iter_args(%yc = %yb)
          -> (tensor<?x?xf32>) {
        %bv = tensor.extract %bd[%e, %o] : tensor<?x?xf32>
        %dot = scf.for %col = %c0 to %n step %c1 iter_args(%acc = %bv)
            -> (f32) {
          %av = tensor.extract %a[%r, %col] : tensor<?x?xf32>
          %wv = tensor.extract %wd[%e, %col, %o] : tensor<?x?x?xf32>
          %p = arith.mulf %av, %wv : f32
          %acc2 = arith.addf %acc, %p : f32
          scf.yield %acc2 : f32
        }
        %yc2 = tensor.insert %dot into %yc[%r, %o] : tensor<?x?xf32>
        scf.yield %yc2 : tensor<?x?xf32>
      }
      scf.yield %yr : tensor<?x?xf32>
    }
    scf.yield %ye : tensor<?x?xf32>
  }
  return %y, %h : tensor<?x?xf32>, tensor<?x?xf32>
}

func.func @__moe_cpu_expert_ffn_grad(%x: tensor<?x?xf32>,
                                     %token_ids: tensor<?xi32>,
                                     %offsets: tensor<?xi32>,
                                     %wgu: tensor<?x?x?xf32>,
                                     %wd: tensor<?x?x?xf32>,
                                     %h: tensor<?x?xf32>, %dy: tensor<?x?xf32>,
                                     %act: i32)
    -> (tensor<?x?xf32>, tensor<?x?x?xf32>, tensor<?x?x?xf32>,
        tensor<?x?xf32>, tensor<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %zero = arith.constant 0.0 : f32
  %r_n = tensor.dim %token_ids, %c0 : tensor<?xi32>
  %t_n = tensor.dim %x, %c0 : tensor<?x?xf32>
  %d = tensor.dim %x, %c1 : tensor<?x?xf32>
  %e_n = tensor.dim %wgu, %c0 : tensor<?x?x?xf32>
  %g_n = tensor.dim %wgu, %c2 : tensor<?x?x?xf32>
  %n = tensor.dim %wd, %c1 : tensor<?x?x?xf32>
  %a = func.call @__moe_cpu_act(%h, %n, %act)
      : (tensor<?x?xf32>, index, i32) -> tensor<?x?xf32>

  // da[r] = dy[r] . wd[e]^T
  %da_init = func.call @__moe_cpu_zeros(%r_n, %n)
      : (index, index) -> tensor<?x?xf32>
  %da = scf.for %e = %c0 to %e_n step %c1 iter_args(%daa = %da_init)
      -> (tensor<?x?xf32>) {
    %e1 = arith.addi %e, %c1 : index
    %lo32 = tensor.extract %offsets[%e] : tensor<?xi32>
    %hi32 = tensor.extract %offsets[%e1] : tensor<?xi32>
    %lo = arith.index_cast %lo32 : i32 to index
    %hi = arith.index_cast %hi32 : i32 to index
    %dae = scf.for %r = %lo to %hi step %c1 iter_args(%dab = %daa)
        -> (tensor<?x?xf32>) {
      %dar = scf.for %col = %c0 to %n step %c1 iter_args(%dac = %dab)
          -> (tensor<?x?xf32>) {
        %dot = scf.for %o = %c0 to %d step %c1 iter_args(%acc = %zero)
            -> (f32) {
          %dyv = tensor.extract %dy[%r, %o] : tensor<?x?xf32>
          %wv = tensor.extract %wd[%e, %col, %o] : tensor<?x?x?xf32>
          %p = arith.mulf %dyv, %wv : f32
          %acc2 = arith.addf %acc, %p : f32
          scf.yield %acc2 : f32
        }
        %dac2 = tensor.insert %dot into %dac[%r, %col] : tensor<?x?xf32>
        scf.yield %dac2 : tensor<?x?xf32>
      }
      scf.yield %dar : tensor<?x?xf32>
    }
    scf.yield %dae : tensor<?x?xf32>
  }
  %dh = func.call @__moe_cpu_act_grad(%h, %da, %act)
      : (tensor<?x?xf32>, tensor<?x?xf32>, i32) -> tensor<?x?xf32>

  // The bias gradients: each expert's column sums of dh and dy, rows ascending.
  %dbgu = func.call @__moe_cpu_segment_sums(%dh, %offsets, %e_n)
      : (tensor<?x?xf32>, tensor<?xi32>, index) -> tensor<?x?xf32>
  %dbd = func.call @__moe_cpu_segment_sums(%dy, %offsets, %e_n)
      : (tensor<?x?xf32>, tensor<?xi32>, index) -> tensor<?x?xf32>

  %dwd_empty = tensor.empty(%e_n, %n, %d) : tensor<?x?x?xf32>
  %dwgu_empty = tensor.empty(%e_n, %d, %g_n) : tensor<?x?x?xf32>
  %dx_init = func.call @__moe_cpu_zeros(%t_n, %d)
      : (index, index) -> tensor<?x?xf32>
  %res:3 = scf.for %e = %c0 to %e_n step %c1
      iter_args(%dwd = %dwd_empty, %dwgu = %dwgu_empty, %dx = %dx_init)
      -> (tensor<?x?x?xf32>, tensor<?x?x?xf32>, tensor<?x?xf32>) {
    %e1 = arith.addi %e, %c1 : index
    %lo32 = tensor.extract %offsets[%e] : tensor<?xi32>
    %hi32 = tensor.extract %offsets[%e1] : tensor<?xi32>
    %lo = arith.index_cast %lo32 : i32 to index
    %hi = arith.index_cast %hi32 : i32 to index
    // d_wd[e] = sum_r a[r]^T . dy[r]
    %dwd2 = scf.for %col = %c0 to %n step %c1 iter_args(%wa = %dwd)
        -> (tensor<?x?x?xf32>) {
      %wrow = scf.for %o = %c0 to %d step %c1 iter_args(%wb = %wa)
          -> (tensor<?x?x?xf32>) {
        %sum = scf.for %r = %lo to %hi step %c1 iter_args(%acc = %zero)
            -> (f32) {
          %av = tensor.extract %a[%r, %col] : tensor<?x?xf32>
          %dyv = tensor.extract %dy[%r, %o] : tensor<?x?xf32>
          %p = arith.mulf %av, %dyv : f32
          %acc2 = arith.addf %acc, %p : f32
          scf.yield %acc2 : f32
        }
        %wb2 = tensor.insert %sum into %wb[%e, %col, %o] : tensor<?x?x?xf32>
        scf.yield %wb2 : tensor<?x?x?xf32>
      }
      scf.yield %wrow : tensor<?x?x?xf32>
    }
    // d_wgu[e] = sum_r x[t(r)]^T . dh[r]
    %dwgu2 = scf.for %i = %c0 to %d step %c1 iter_args(%wa = %dwgu)
        -> (tensor<?x?x?xf32>) {
      %wrow = scf.for %col = %c0 to %g_n step %c1 iter_args(%wb = %wa)
          -> (tensor<?x?x?xf32>) {
        %sum = scf.for %r = %lo to %hi step %c1 iter_args(%acc = %zero)
            -> (f32) {
          %t32 = tensor.extract %token_ids[%r] : tensor<?xi32>
          %t = arith.index_cast %t32 : i32 to index
          %xv = tensor.extract %x[%t, %i] : tensor<?x?xf32>
          %dhv = tensor.extract %dh[%r, %col] : tensor<?x?xf32>
          %p = arith.mulf %xv, %dhv : f32
          %acc2 = arith.addf %acc, %p : f32
          scf.yield %acc2 : f32
        }
        %wb2 = tensor.insert %sum into %wb[%e, %i, %col] : tensor<?x?x?xf32>
        scf.yield %wb2 : tensor<?x?x?xf32>
      }
      scf.yield %wrow : tensor<?x?x?xf32>
    }
    // dx[t(r)] += dh[r] . wgu[e]^T, rows ascending
    %dx2 = scf.for %r = %lo to %hi step %c1 iter_args(%xa = %dx)
        -> (tensor<?x?xf32>) {
      %t32 = tensor.extract %token_ids[%r] : tensor<?xi32>
      %t = arith.index_cast %t32 : i32 to index
      %xrow = scf.for %i = %c0 to %d step %c1 iter_args(%xb = %xa)
          -> (tensor<?x?xf32>) {
        %dot = scf.for %col = %c0 to %g_n step %c1 iter_args(%acc = %zero)
            -> (f32) {
          %dhv = tensor.extract %dh[%r, %col] : tensor<?x?xf32>
          %wv = tensor.extract %wgu[%e, %i, %col] : tensor<?x?x?xf32>
          %p = arith.mulf %dhv, %wv : f32
          %acc2 = arith.addf %acc, %p : f32
          scf.yield %acc2 : f32
        }
        %old = tensor.extract %xb[%t, %i] : tensor<?x?xf32>
        %new = arith.addf %old, %dot : f32
        %xb2 = tensor.insert %new into %xb[%t, %i] : tensor<?x?xf32>
        scf.yield %xb2 : tensor<?x?xf32>
      }
      scf.yield %xrow : tensor<?x?xf32>
    }
    scf.yield %dwd2, %dwgu2, %dx2
        : tensor<?x?x?xf32>, tensor<?x?x?xf32>, tensor<?x?xf32>
  }
  return %res#2, %res#1, %res#0, %dbgu, %dbd
      : tensor<?x?xf32>, tensor<?x?x?xf32>, tensor<?x?x?xf32>,
        tensor<?x?xf32>, tensor<?x?xf32>
}

// out[e, c] = the sum of rows[r, c] over the rows r of expert e.
func.func @__moe_cpu_segment_sums(%rows: tensor<?x?xf32>,
                                  %offsets: tensor<?xi32>, %e_n: index)
    -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %cols = tensor.dim %rows, %c1 : tensor<?x?xf32>
  %init = func.call @__moe_cpu_zeros(%e_n, %cols)
      : (index, index) -> tensor<?x?xf32>
  %out = scf.for %e = %c0 to %e_n step %c1 iter_args(%oa = %init)
      -> (tensor<?x?xf32>) {
    %e1 = arith.addi %e, %c1 : index
    %lo32 = tensor.extract %offsets[%e] : tensor<?xi32>
    %hi32 = tensor.extract %offsets[%e1] : tensor<?xi32>
    %lo = arith.index_cast %lo32 : i32 to index
    %hi = arith.index_cast %hi32 : i32 to index
    %oe = scf.for %c = %c0 to %cols step %c1 iter_args(%ob = %oa)
        -> (tensor<?x?xf32>) {
      %sum = scf.for %r = %lo to %hi step %c1 iter_args(%acc = %zero)
          -> (f32) {
        %v = tensor.extract %rows[%r, %c] : tensor<?x?xf32>
        %acc2 = arith.addf %acc, %v : f32
        scf.yield %acc2 : f32
      }
      %ob2 = tensor.insert %sum into %ob[%e, %c] : tensor<?x?xf32>
      scf.yield %ob2 : tensor<?x?xf32>
    }
    scf.yield %oe : tensor<?x?xf32>
  }
  return %out : tensor<?x?xf32>
}

func.func @__moe_cpu_expert_combine_grad(%x: tensor<?x?xf32>,
                                         %token_ids: tensor<?xi32>,
                                         %offsets: tensor<?xi32>,
                                         %rows: tensor<?x?xi32>,
                                         %weights: tensor<?x?xf32>,
                                         %wgu: tensor<?x?x?xf32>,
                                         %wd: tensor<?x?x?xf32>,
                                         %h: tensor<?x?xf32>,
                                         %dout: tensor<?x?xf32>,
                                         %bd: tensor<?x?xf32>, %act: i32)
    -> (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?x?xf32>,
        tensor<?x?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %c0_i32 = arith.constant 0 : i32
  %r_n = tensor.dim %token_ids, %c0 : tensor<?xi32>
  %t_n = tensor.dim %rows, %c0 : tensor<?x?xi32>
  %k = tensor.dim %rows, %c1 : tensor<?x?xi32>
  %d = tensor.dim %x, %c1 : tensor<?x?xf32>
  %n = tensor.dim %wd, %c1 : tensor<?x?x?xf32>
  %r_n_i32 = arith.index_cast %r_n : index to i32
  %owner = func.call @__moe_cpu_row_experts(%offsets, %r_n)
      : (tensor<?xi32>, index) -> tensor<?xi32>
  %a = func.call @__moe_cpu_act(%h, %n, %act)
      : (tensor<?x?xf32>, index, i32) -> tensor<?x?xf32>
  %dy_init = func.call @__moe_cpu_zeros(%r_n, %d)
      : (index, index) -> tensor<?x?xf32>
  %dw_init = func.call @__moe_cpu_zeros(%t_n, %k)
      : (index, index) -> tensor<?x?xf32>
  %res:2 = scf.for %t = %c0 to %t_n step %c1
      iter_args(%dy = %dy_init, %dw = %dw_init)
      -> (tensor<?x?xf32>, tensor<?x?xf32>) {
    %row:2 = scf.for %j = %c0 to %k step %c1
        iter_args(%dya = %dy, %dwa = %dw)
        -> (tensor<?x?xf32>, tensor<?x?xf32>) {
      %r32 = tensor.extract %rows[%t, %j] : tensor<?x?xi32>
      %ge = arith.cmpi sge, %r32, %c0_i32 : i32
      %lt = arith.cmpi slt, %r32, %r_n_i32 : i32
      %inr = arith.andi %ge, %lt : i1
      %rc32 = arith.select %inr, %r32, %c0_i32 : i32
      %rc = arith.index_cast %rc32 : i32 to index
      %e32 = tensor.extract %owner[%rc] : tensor<?xi32>
      %owned = arith.cmpi sge, %e32, %c0_i32 : i32
      %kept = arith.andi %inr, %owned : i1
      %q:2 = scf.if %kept -> (tensor<?x?xf32>, tensor<?x?xf32>) {
        %e = arith.index_cast %e32 : i32 to index
        %wt = tensor.extract %weights[%t, %j] : tensor<?x?xf32>
        %dya2 = scf.for %o = %c0 to %d step %c1 iter_args(%yb = %dya)
            -> (tensor<?x?xf32>) {
          %dv = tensor.extract %dout[%t, %o] : tensor<?x?xf32>
          %p = arith.mulf %wt, %dv : f32
          %yb2 = tensor.insert %p into %yb[%rc, %o] : tensor<?x?xf32>
          scf.yield %yb2 : tensor<?x?xf32>
        }
        // <dout[t], bd[e]> + <dout[t] . wd[e]^T, act(h[r])>
        %dsb = scf.for %o = %c0 to %d step %c1 iter_args(%acc = %zero)
            -> (f32) {
          %dv = tensor.extract %dout[%t, %o] : tensor<?x?xf32>
          %bv = tensor.extract %bd[%e, %o] : tensor<?x?xf32>
          %p = arith.mulf %dv, %bv : f32
          %acc2 = arith.addf %acc, %p : f32
          scf.yield %acc2 : f32
        }
        %dsv = scf.for %col = %c0 to %n step %c1 iter_args(%acc = %dsb)
            -> (f32) {
          %ga = scf.for %o = %c0 to %d step %c1 iter_args(%acc2 = %zero)
              -> (f32) {
            %dv = tensor.extract %dout[%t, %o] : tensor<?x?xf32>
            %wv = tensor.extract %wd[%e, %col, %o] : tensor<?x?x?xf32>
            %p = arith.mulf %dv, %wv : f32
            %acc3 = arith.addf %acc2, %p : f32
            scf.yield %acc3 : f32
          }
          %av = tensor.extract %a[%rc, %col] : tensor<?x?xf32>
          %p = arith.mulf %ga, %av : f32
          %acc4 = arith.addf %acc, %p : f32
          scf.yield %acc4 : f32
        }
        %dwa2 = tensor.insert %dsv into %dwa[%t, %j] : tensor<?x?xf32>
        scf.yield %dya2, %dwa2 : tensor<?x?xf32>, tensor<?x?xf32>
      } else {
        scf.yield %dya, %dwa : tensor<?x?xf32>, tensor<?x?xf32>
      }
      scf.yield %q#0, %q#1 : tensor<?x?xf32>, tensor<?x?xf32>
    }
    scf.yield %row#0, %row#1 : tensor<?x?xf32>, tensor<?x?xf32>
  }
  %g:5 = func.call @__moe_cpu_expert_ffn_grad(%x, %token_ids, %offsets, %wgu,
                                              %wd, %h, %res#0, %act)
      : (tensor<?x?xf32>, tensor<?xi32>, tensor<?xi32>, tensor<?x?x?xf32>,
         tensor<?x?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>, i32)
      -> (tensor<?x?xf32>, tensor<?x?x?xf32>, tensor<?x?x?xf32>,
          tensor<?x?xf32>, tensor<?x?xf32>)
  return %g#0, %res#1, %g#1, %g#2, %g#3, %g#4
      : tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?x?xf32>, tensor<?x?x?xf32>,
        tensor<?x?xf32>, tensor<?x?xf32>
}

//===----------------------------------------------------------------------===//
// Shared expert
//===----------------------------------------------------------------------===//

func.func @__moe_cpu_shared_expert(%x: tensor<?x?xf32>, %wgu: tensor<?x?xf32>,
                                   %wd: tensor<?x?xf32>, %act: i32)
    -> (tensor<?x?xf32>, tensor<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %m = tensor.dim %wd, %c0 : tensor<?x?xf32>
  %h = func.call @__moe_cpu_mm(%x, %wgu)
      : (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<?x?xf32>
  %a = func.call @__moe_cpu_act(%h, %m, %act)
      : (tensor<?x?xf32>, index, i32) -> tensor<?x?xf32>
  %y = func.call @__moe_cpu_mm(%a, %wd)
      : (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<?x?xf32>
  return %y, %h : tensor<?x?xf32>, tensor<?x?xf32>
}

func.func @__moe_cpu_shared_expert_grad(%x: tensor<?x?xf32>,
                                        %wgu: tensor<?x?xf32>,
                                        %wd: tensor<?x?xf32>,
                                        %h: tensor<?x?xf32>,
                                        %dy: tensor<?x?xf32>, %act: i32)
    -> (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %m = tensor.dim %wd, %c0 : tensor<?x?xf32>
  %a = func.call @__moe_cpu_act(%h, %m, %act)
      : (tensor<?x?xf32>, index, i32) -> tensor<?x?xf32>
  %da = func.call @__moe_cpu_mm_nt(%dy, %wd)
      : (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<?x?xf32>
  %dh = func.call @__moe_cpu_act_grad(%h, %da, %act)
      : (tensor<?x?xf32>, tensor<?x?xf32>, i32) -> tensor<?x?xf32>
  %dwd = func.call @__moe_cpu_mm_tn(%a, %dy)
      : (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<?x?xf32>
  %dwgu = func.call @__moe_cpu_mm_tn(%x, %dh)
      : (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<?x?xf32>
  %dx = func.call @__moe_cpu_mm_nt(%dh, %wgu)
      : (tensor<?x?xf32>, tensor<?x?xf32>) -> tensor<?x?xf32>
  return %dx, %dwgu, %dwd : tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>
}

//===----------------------------------------------------------------------===//
// Combine
//===----------------------------------------------------------------------===//

func.func @__moe_cpu_combine(%y: tensor<?x?xf32>, %weights: tensor<?x?xf32>,
                             %rows: tensor<?x?xi32>) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c0_i32 = arith.constant 0 : i32
  %r_n = tensor.dim %y, %c0 : tensor<?x?xf32>
  %d = tensor.dim %y, %c1 : tensor<?x?xf32>
  %t_n = tensor.dim %rows, %c0 : tensor<?x?xi32>
  %k = tensor.dim %rows, %c1 : tensor<?x?xi32>
  %r_n_i32 = arith.index_cast %r_n : index to i32
  %out_init = func.call @__moe_cpu_zeros(%t_n, %d)
      : (index, index) -> tensor<?x?xf32>
  %out = scf.for %t = %c0 to %t_n step %c1 iter_args(%oa = %out_init)
      -> (tensor<?x?xf32>) {
    %orow = scf.for %j = %c0 to %k step %c1 iter_args(%ob = %oa)
        -> (tensor<?x?xf32>) {
      %r32 = tensor.extract %rows[%t, %j] : tensor<?x?xi32>
      %ge = arith.cmpi sge, %r32, %c0_i32 : i32
      %lt = arith.cmpi slt, %r32, %r_n_i32 : i32
      %kept = arith.andi %ge, %lt : i1
      %ob2 = scf.if %kept -> (tensor<?x?xf32>) {
        %r = arith.index_cast %r32 : i32 to index
        %wt = tensor.extract %weights[%t, %j] : tensor<?x?xf32>
        %oc = scf.for %o = %c0 to %d step %c1 iter_args(%od = %ob)
            -> (tensor<?x?xf32>) {
          %yv = tensor.extract %y[%r, %o] : tensor<?x?xf32>
          %p = arith.mulf %wt, %yv : f32
          %old = tensor.extract %od[%t, %o] : tensor<?x?xf32>
          %new = arith.addf %old, %p : f32
          %od2 = tensor.insert %new into %od[%t, %o] : tensor<?x?xf32>
          scf.yield %od2 : tensor<?x?xf32>
        }
        scf.yield %oc : tensor<?x?xf32>
      } else {
        scf.yield %ob : tensor<?x?xf32>
      }
      scf.yield %ob2 : tensor<?x?xf32>
    }
    scf.yield %orow : tensor<?x?xf32>
  }
  return %out : tensor<?x?xf32>
}

func.func @__moe_cpu_combine_grad(%dout: tensor<?x?xf32>,
                                  %weights: tensor<?x?xf32>,
                                  %rows: tensor<?x?xi32>, %y: tensor<?x?xf32>)
    -> (tensor<?x?xf32>, tensor<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %c0_i32 = arith.constant 0 : i32
  %r_n = tensor.dim %y, %c0 : tensor<?x?xf32>
  %d = tensor.dim %y, %c1 : tensor<?x?xf32>
  %t_n = tensor.dim %rows, %c0 : tensor<?x?xi32>
  %k = tensor.dim %rows, %c1 : tensor<?x?xi32>
  %r_n_i32 = arith.index_cast %r_n : index to i32
  %dy_init = func.call @__moe_cpu_zeros(%r_n, %d)
      : (index, index) -> tensor<?x?xf32>
  %dw_init = func.call @__moe_cpu_zeros(%t_n, %k)
      : (index, index) -> tensor<?x?xf32>
  %res:2 = scf.for %t = %c0 to %t_n step %c1
      iter_args(%dy = %dy_init, %dw = %dw_init)
      -> (tensor<?x?xf32>, tensor<?x?xf32>) {
    %row:2 = scf.for %j = %c0 to %k step %c1
        iter_args(%dya = %dy, %dwa = %dw)
        -> (tensor<?x?xf32>, tensor<?x?xf32>) {
      %r32 = tensor.extract %rows[%t, %j] : tensor<?x?xi32>
      %ge = arith.cmpi sge, %r32, %c0_i32 : i32
      %lt = arith.cmpi slt, %r32, %r_n_i32 : i32
      %kept = arith.andi %ge, %lt : i1
      %q:2 = scf.if %kept -> (tensor<?x?xf32>, tensor<?x?xf32>) {
        %r = arith.index_cast %r32 : i32 to index
        %wt = tensor.extract %weights[%t, %j] : tensor<?x?xf32>
        %z:2 = scf.for %o = %c0 to %d step %c1
            iter_args(%yb = %dya, %acc = %zero) -> (tensor<?x?xf32>, f32) {
          %dv = tensor.extract %dout[%t, %o] : tensor<?x?xf32>
          %p = arith.mulf %wt, %dv : f32
          %yb2 = tensor.insert %p into %yb[%r, %o] : tensor<?x?xf32>
          %yv = tensor.extract %y[%r, %o] : tensor<?x?xf32>
          %p2 = arith.mulf %dv, %yv : f32
          %acc2 = arith.addf %acc, %p2 : f32
          scf.yield %yb2, %acc2 : tensor<?x?xf32>, f32
        }
        %dwa2 = tensor.insert %z#1 into %dwa[%t, %j] : tensor<?x?xf32>
        scf.yield %z#0, %dwa2 : tensor<?x?xf32>, tensor<?x?xf32>
      } else {
        scf.yield %dya, %dwa : tensor<?x?xf32>, tensor<?x?xf32>
      }
      scf.yield %q#0, %q#1 : tensor<?x?xf32>, tensor<?x?xf32>
    }
    scf.yield %row#0, %row#1 : tensor<?x?xf32>, tensor<?x?xf32>
  }
  return %res#0, %res#1 : tensor<?x?xf32>, tensor<?x?xf32>
}

//===----------------------------------------------------------------------===//
// Auxiliary losses
//===----------------------------------------------------------------------===//

func.func @__moe_cpu_aux_loss(%logits: tensor<?x?xf32>,
                              %experts: tensor<?x?xi32>, %scoring: i32)
    -> (tensor<f32>, tensor<f32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %t_n = tensor.dim %logits, %c0 : tensor<?x?xf32>
  %e_n = tensor.dim %logits, %c1 : tensor<?x?xf32>
  %k = tensor.dim %experts, %c1 : tensor<?x?xi32>
  %tk = arith.muli %t_n, %k : index
  %tf = func.call @__moe_cpu_index_to_f32(%t_n) : (index) -> f32
  %tkf = func.call @__moe_cpu_index_to_f32(%tk) : (index) -> f32
  %ef = func.call @__moe_cpu_index_to_f32(%e_n) : (index) -> f32
  %p = func.call @__moe_cpu_aux_probs(%logits, %scoring)
      : (tensor<?x?xf32>, i32) -> tensor<?x?xf32>
  %counts = func.call @__moe_cpu_expert_counts(%experts, %e_n)
      : (tensor<?x?xi32>, index) -> tensor<?xf32>
  // sum_e f_e * P_e
  %fp = scf.for %e = %c0 to %e_n step %c1 iter_args(%acc = %zero) -> (f32) {
    %cnt = tensor.extract %counts[%e] : tensor<?xf32>
    %f = arith.divf %cnt, %tkf : f32
    %ps = scf.for %t = %c0 to %t_n step %c1 iter_args(%s = %zero) -> (f32) {
      %v = tensor.extract %p[%t, %e] : tensor<?x?xf32>
      %s2 = arith.addf %s, %v : f32
      scf.yield %s2 : f32
    }
    %pm = arith.divf %ps, %tf : f32
    %prod = arith.mulf %f, %pm : f32
    %acc2 = arith.addf %acc, %prod : f32
    scf.yield %acc2 : f32
  }
  %lb = arith.mulf %ef, %fp : f32
  %zsum = scf.for %t = %c0 to %t_n step %c1 iter_args(%s = %zero) -> (f32) {
    %lse = func.call @__moe_cpu_lse(%logits, %t)
        : (tensor<?x?xf32>, index) -> f32
    %sq = arith.mulf %lse, %lse : f32
    %s2 = arith.addf %s, %sq : f32
    scf.yield %s2 : f32
  }
  %z = arith.divf %zsum, %tf : f32
  %empty = arith.cmpi eq, %t_n, %c0 : index
  %lb2 = arith.select %empty, %zero, %lb : f32
  %z2 = arith.select %empty, %zero, %z : f32
  %lbt = tensor.from_elements %lb2 : tensor<f32>
  %zt = tensor.from_elements %z2 : tensor<f32>
  return %lbt, %zt : tensor<f32>, tensor<f32>
}

func.func @__moe_cpu_aux_loss_grad(%logits: tensor<?x?xf32>,
                                   %experts: tensor<?x?xi32>,
                                   %d_lb: tensor<f32>, %d_z: tensor<f32>,
                                   %scoring: i32) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %two = arith.constant 2.0 : f32
  %c0_i32 = arith.constant 0 : i32
  %t_n = tensor.dim %logits, %c0 : tensor<?x?xf32>
  %e_n = tensor.dim %logits, %c1 : tensor<?x?xf32>
  %k = tensor.dim %experts, %c1 : tensor<?x?xi32>
  %tk = arith.muli %t_n, %k : index
  %tf = func.call @__moe_cpu_index_to_f32(%t_n) : (index) -> f32
  %tkf = func.call @__moe_cpu_index_to_f32(%tk) : (index) -> f32
  %ef = func.call @__moe_cpu_index_to_f32(%e_n) : (index) -> f32
  %dlb = tensor.extract %d_lb[] : tensor<f32>
  %dz = tensor.extract %d_z[] : tensor<f32>
  %is_softmax = arith.cmpi eq, %scoring, %c0_i32 : i32
  %counts = func.call @__moe_cpu_expert_counts(%experts, %e_n)
      : (tensor<?x?xi32>, index) -> tensor<?xf32>
  // g_e = d_lb * E * f_e / T
  %dlbe = arith.mulf %dlb, %ef : f32
  %g_empty = tensor.empty(%e_n) : tensor<?xf32>
  %g = scf.for %e = %c0 to %e_n step %c1 iter_args(%ga = %g_empty)
      -> (tensor<?xf32>) {
    %cnt = tensor.extract %counts[%e] : tensor<?xf32>
    %f = arith.divf %cnt, %tkf : f32
    %v = arith.mulf %dlbe, %f : f32
    %v2 = arith.divf %v, %tf : f32
    %ga2 = tensor.insert %v2 into %ga[%e] : tensor<?xf32>
    scf.yield %ga2 : tensor<?xf32>
  }
  %sm = func.call @__moe_cpu_softmax(%logits)
      : (tensor<?x?xf32>) -> tensor<?x?xf32>
  %sig = func.call @__moe_cpu_sigmoid_all(%logits)
      : (tensor<?x?xf32>) -> tensor<?x?xf32>
  %p = func.call @__moe_cpu_aux_probs(%logits, %scoring)
      : (tensor<?x?xf32>, i32) -> tensor<?x?xf32>
  %dz2 = arith.mulf %dz, %two : f32
  %init = tensor.empty(%t_n, %e_n) : tensor<?x?xf32>
  %r = scf.for %t = %c0 to %t_n step %c1 iter_args(%acc = %init)
      -> (tensor<?x?xf32>) {
    %sums:2 = scf.for %e = %c0 to %e_n step %c1
        iter_args(%dot = %zero, %ssum = %zero) -> (f32, f32) {
      %gv = tensor.extract %g[%e] : tensor<?xf32>
      %pv = tensor.extract %p[%t, %e] : tensor<?x?xf32>
      %sv = tensor.extract %sig[%t, %e] : tensor<?x?xf32>
      %prod = arith.mulf %gv, %pv : f32
      %dot2 = arith.addf %dot, %prod : f32
      %ssum2 = arith.addf %ssum, %sv : f32
      scf.yield %dot2, %ssum2 : f32, f32
    }
    %lse = func.call @__moe_cpu_lse(%logits, %t)
        : (tensor<?x?xf32>, index) -> f32
    %zl = arith.mulf %dz2, %lse : f32
    %zc = arith.divf %zl, %tf : f32
    %row = scf.for %e = %c0 to %e_n step %c1 iter_args(%a = %acc)
        -> (tensor<?x?xf32>) {
      %gv = tensor.extract %g[%e] : tensor<?xf32>
      %pv = tensor.extract %p[%t, %e] : tensor<?x?xf32>
      %sv = tensor.extract %sig[%t, %e] : tensor<?x?xf32>
      %smv = tensor.extract %sm[%t, %e] : tensor<?x?xf32>
      %diff = arith.subf %gv, %sums#0 : f32
      // softmax: p * (g - <g, p>)
      %soft = arith.mulf %pv, %diff : f32
      // sigmoid: (g - <g, p>) / sum(sigma) * sigma * (1 - sigma)
      %dsig = arith.divf %diff, %sums#1 : f32
      %oms = arith.subf %one, %sv : f32
      %s1 = arith.mulf %dsig, %sv : f32
      %sigv = arith.mulf %s1, %oms : f32
      %lbv = arith.select %is_softmax, %soft, %sigv : f32
      %zv = arith.mulf %zc, %smv : f32
      %v = arith.addf %lbv, %zv : f32
      %a2 = tensor.insert %v into %a[%t, %e] : tensor<?x?xf32>
      scf.yield %a2 : tensor<?x?xf32>
    }
    scf.yield %row : tensor<?x?xf32>
  }
  return %r : tensor<?x?xf32>
}

//===----------------------------------------------------------------------===//
// Selection-bias update (auxiliary-loss-free balancing)
//===----------------------------------------------------------------------===//

// The loads of `experts` as integers (entries outside [0, E) not counted),
// then with D_e = sum(loads) - E * load_e (E times mean - load_e, exact):
// bias_e + rate * sign(D_e) (`rule` 0) or bias_e + rate * (D_e / sum(loads))
// (`rule` 1). The bias unchanged where nothing was counted.
func.func @__moe_cpu_update_selection_bias(%bias: tensor<?xf32>,
                                           %experts: tensor<?x?xi32>,
                                           %rate: f32, %rule: i32)
    -> tensor<?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c0_i32 = arith.constant 0 : i32
  %c0_i64 = arith.constant 0 : i64
  %c1_i64 = arith.constant 1 : i64
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %minus_one = arith.constant -1.0 : f32
  %e_n = tensor.dim %bias, %c0 : tensor<?xf32>
  %t_n = tensor.dim %experts, %c0 : tensor<?x?xi32>
  %k = tensor.dim %experts, %c1 : tensor<?x?xi32>
  %e_n_i64 = arith.index_cast %e_n : index to i64
  %empty = tensor.empty(%e_n) : tensor<?xi64>
  %init = linalg.fill ins(%c0_i64 : i64) outs(%empty : tensor<?xi64>)
      -> tensor<?xi64>
  %loads = scf.for %t = %c0 to %t_n step %c1 iter_args(%acc = %init)
      -> (tensor<?xi64>) {
    %row = scf.for %j = %c0 to %k step %c1 iter_args(%a = %acc)
        -> (tensor<?xi64>) {
      %x32 = tensor.extract %experts[%t, %j] : tensor<?x?xi32>
      %x = arith.extsi %x32 : i32 to i64
      %ge = arith.cmpi sge, %x, %c0_i64 : i64
      %lt = arith.cmpi slt, %x, %e_n_i64 : i64
      %ok = arith.andi %ge, %lt : i1
      %a2 = scf.if %ok -> (tensor<?xi64>) {
        %e = arith.index_cast %x : i64 to index
        %old = tensor.extract %a[%e] : tensor<?xi64>
        %new = arith.addi %old, %c1_i64 : i64
        %a3 = tensor.insert %new into %a[%e] : tensor<?xi64>
        scf.yield %a3 : tensor<?xi64>
      } else {
        scf.yield %a : tensor<?xi64>
      }
      scf.yield %a2 : tensor<?xi64>
    }
    scf.yield %row : tensor<?xi64>
  }
  %total = scf.for %e = %c0 to %e_n step %c1 iter_args(%s = %c0_i64) -> (i64) {
    %l = tensor.extract %loads[%e] : tensor<?xi64>
    %s2 = arith.addi %s, %l : i64
    scf.yield %s2 : i64
  }
  %none = arith.cmpi eq, %total, %c0_i64 : i64
  %total_f = arith.sitofp %total : i64 to f32
  %sign_rule = arith.cmpi eq, %rule, %c0_i32 : i32
  %res = scf.for %e = %c0 to %e_n step %c1 iter_args(%acc = %bias)
      -> (tensor<?xf32>) {
    %b = tensor.extract %bias[%e] : tensor<?xf32>
    %l = tensor.extract %loads[%e] : tensor<?xi64>
    %el = arith.muli %e_n_i64, %l : i64
    %diff = arith.subi %total, %el : i64
    %pos = arith.cmpi sgt, %diff, %c0_i64 : i64
    %neg = arith.cmpi slt, %diff, %c0_i64 : i64
    %s_pos = arith.select %pos, %one, %zero : f32
    %sign = arith.select %neg, %minus_one, %s_pos : f32
    %diff_f = arith.sitofp %diff : i64 to f32
    %ratio = arith.divf %diff_f, %total_f : f32
    %step = arith.select %sign_rule, %sign, %ratio : f32
    %upd = arith.mulf %rate, %step : f32
    %moved = arith.addf %b, %upd : f32
    %v = arith.select %none, %b, %moved : f32
    %acc2 = tensor.insert %v into %acc[%e] : tensor<?xf32>
    scf.yield %acc2 : tensor<?xf32>
  }
  return %res : tensor<?xf32>
}

//===----------------------------------------------------------------------===//
// Expert parallelism (one rank's local halves; the all-to-alls are not here)
//===----------------------------------------------------------------------===//
//
// S ranks (`ranks`) of El = E / S local experts each, C rows (`capacity`)
// from one rank to one rank: rank s's block of the expert-order rows is
// [offsets[s * El], offsets[(s + 1) * El]), of which the first C are kept.
// Indices read from tensors are checked before use: one out of range gives a
// zero row (or nothing) instead of an access out of bounds.

// 0 <= i < n, for an index read from a tensor.
func.func @__moe_cpu_in_range(%i: index, %n: index) -> i1 {
  %c0 = arith.constant 0 : index
  %ge = arith.cmpi sge, %i, %c0 : index
  %lt = arith.cmpi slt, %i, %n : index
  %ok = arith.andi %ge, %lt : i1
  return %ok : i1
}

// dst[r] = src[i] (rows of the same width).
func.func @__moe_cpu_copy_row(%dst: tensor<?x?xf32>, %r: index,
                              %src: tensor<?x?xf32>, %i: index)
    -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %d = tensor.dim %dst, %c1 : tensor<?x?xf32>
  %out = scf.for %col = %c0 to %d step %c1 iter_args(%a = %dst)
      -> (tensor<?x?xf32>) {
    %v = tensor.extract %src[%i, %col] : tensor<?x?xf32>
    %a2 = tensor.insert %v into %a[%r, %col] : tensor<?x?xf32>
    scf.yield %a2 : tensor<?x?xf32>
  }
  return %out : tensor<?x?xf32>
}

// [0, 1, ..., n - 1]
func.func @__moe_cpu_iota(%n: index) -> tensor<?xi32> {
  %e = tensor.empty(%n) : tensor<?xi32>
  %r = linalg.generic {
      indexing_maps = [affine_map<(i) -> (i)>],
      iterator_types = ["parallel"]}
      outs(%e : tensor<?xi32>) {
  ^bb0(%o: i32):
    %i = linalg.index 0 : index
    %i32 = arith.index_cast %i : index to i32
    linalg.yield %i32 : i32
  } -> tensor<?xi32>
  return %r : tensor<?xi32>
}

// The blocks of `offsets` [E + 1] for S ranks: El, and the number of ranks
// to visit (0 when offsets is empty, which has no blocks).
func.func @__moe_cpu_ep_layout(%offsets: tensor<?xi32>, %ranks: index)
    -> (index, index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %offs_n = tensor.dim %offsets, %c0 : tensor<?xi32>
  %e_n1 = arith.subi %offs_n, %c1 : index
  %e_n = arith.maxsi %e_n1, %c0 : index
  %el = arith.divui %e_n, %ranks : index
  %any = arith.cmpi sgt, %offs_n, %c0 : index
  %s_n = arith.select %any, %ranks, %c0 : index
  return %el, %s_n : index, index
}

// Rank s's block: its first row offsets[s * El], the rows kept (at most C)
// and the rows dropped past C.
func.func @__moe_cpu_ep_block(%offsets: tensor<?xi32>, %s: index, %el: index,
                              %capacity: index) -> (index, index, index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %first = arith.muli %s, %el : index
  %s1 = arith.addi %s, %c1 : index
  %last = arith.muli %s1, %el : index
  %lo32 = tensor.extract %offsets[%first] : tensor<?xi32>
  %hi32 = tensor.extract %offsets[%last] : tensor<?xi32>
  %lo = arith.index_cast %lo32 : i32 to index
  %hi = arith.index_cast %hi32 : i32 to index
  %span = arith.subi %hi, %lo : index
  %n = arith.maxsi %span, %c0 : index
  %kept = arith.minsi %n, %capacity : index
  %dropped = arith.subi %n, %kept : index
  return %lo, %kept, %dropped : index, index, index
}

// moe.ep_pack with gather: send [S * C, d], send[s * C + j] = x[token_ids[
// offsets[s * El] + j]] for the kept rows j of rank s's block, zero rows
// elsewhere; send_counts [S, El] (i32), the rows of each local expert among
// the kept rows (a prefix of the block, which is in expert order); dropped
// [S] (i32).
func.func @__moe_cpu_ep_pack_gather(%x: tensor<?x?xf32>,
                                    %offsets: tensor<?xi32>,
                                    %token_ids: tensor<?xi32>, %ranks: index,
                                    %capacity: index)
    -> (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c0_i32 = arith.constant 0 : i32
  %t_n = tensor.dim %x, %c0 : tensor<?x?xf32>
  %d = tensor.dim %x, %c1 : tensor<?x?xf32>
  %r_n = tensor.dim %token_ids, %c0 : tensor<?xi32>
  %el, %s_n = func.call @__moe_cpu_ep_layout(%offsets, %ranks)
      : (tensor<?xi32>, index) -> (index, index)
  %slots = arith.muli %ranks, %capacity : index
  %send_init = func.call @__moe_cpu_zeros(%slots, %d)
      : (index, index) -> tensor<?x?xf32>
  %counts_empty = tensor.empty(%ranks, %el) : tensor<?x?xi32>
  %counts_init = linalg.fill ins(%c0_i32 : i32)
      outs(%counts_empty : tensor<?x?xi32>) -> tensor<?x?xi32>
  %dropped_empty = tensor.empty(%ranks) : tensor<?xi32>
  %dropped_init = linalg.fill ins(%c0_i32 : i32)
      outs(%dropped_empty : tensor<?xi32>) -> tensor<?xi32>
  %res:3 = scf.for %s = %c0 to %s_n step %c1
      iter_args(%send = %send_init, %counts = %counts_init,
                %dropped = %dropped_init)
      -> (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?xi32>) {
    %b:3 = func.call @__moe_cpu_ep_block(%offsets, %s, %el, %capacity)
        : (tensor<?xi32>, index, index, index) -> (index, index, index)
    %drop32 = arith.index_cast %b#2 : index to i32
    %dropped2 = tensor.insert %drop32 into %dropped[%s] : tensor<?xi32>
    // Expert e's kept rows: [offsets[g], offsets[g + 1]) cut at the end of
    // the kept prefix.
    %end = arith.addi %b#0, %b#1 : index
    %first = arith.muli %s, %el : index
    %counts2 = scf.for %e = %c0 to %el step %c1 iter_args(%ca = %counts)
        -> (tensor<?x?xi32>) {
      %g = arith.addi %first, %e : index
      %g1 = arith.addi %g, %c1 : index
      %a32 = tensor.extract %offsets[%g] : tensor<?xi32>
      %z32 = tensor.extract %offsets[%g1] : tensor<?xi32>
      %a = arith.index_cast %a32 : i32 to index
      %z = arith.index_cast %z32 : i32 to index
      %a_kept = arith.minsi %a, %end : index
      %z_kept = arith.minsi %z, %end : index
      %n0 = arith.subi %z_kept, %a_kept : index
      %n = arith.maxsi %n0, %c0 : index
      %n32 = arith.index_cast %n : index to i32
      %ca2 = tensor.insert %n32 into %ca[%s, %e] : tensor<?x?xi32>
      scf.yield %ca2 : tensor<?x?xi32>
    }
    %base = arith.muli %s, %capacity : index
    %send2 = scf.for %j = %c0 to %b#1 step %c1 iter_args(%sa = %send)
        -> (tensor<?x?xf32>) {
      %i = arith.addi %b#0, %j : index
      %i_ok = func.call @__moe_cpu_in_range(%i, %r_n) : (index, index) -> i1
      %sa2 = scf.if %i_ok -> (tensor<?x?xf32>) {
        %t32 = tensor.extract %token_ids[%i] : tensor<?xi32>
        %t = arith.index_cast %t32 : i32 to index
        %t_ok = func.call @__moe_cpu_in_range(%t, %t_n)
            : (index, index) -> i1
        %sa3 = scf.if %t_ok -> (tensor<?x?xf32>) {
          %row = arith.addi %base, %j : index
          %sa4 = func.call @__moe_cpu_copy_row(%sa, %row, %x, %t)
              : (tensor<?x?xf32>, index, tensor<?x?xf32>, index)
              -> tensor<?x?xf32>
          scf.yield %sa4 : tensor<?x?xf32>
        } else {
          scf.yield %sa : tensor<?x?xf32>
        }
        scf.yield %sa3 : tensor<?x?xf32>
      } else {
        scf.yield %sa : tensor<?x?xf32>
      }
      scf.yield %sa2 : tensor<?x?xf32>
    }
    scf.yield %send2, %counts2, %dropped2
        : tensor<?x?xf32>, tensor<?x?xi32>, tensor<?xi32>
  }
  return %res#0, %res#1, %res#2
      : tensor<?x?xf32>, tensor<?x?xi32>, tensor<?xi32>
}

// moe.ep_pack without gather: the rows [R, d] are already in expert order,
// so row i of a block is rows[i].
func.func @__moe_cpu_ep_pack(%rows: tensor<?x?xf32>, %offsets: tensor<?xi32>,
                             %ranks: index, %capacity: index)
    -> (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?xi32>) {
  %c0 = arith.constant 0 : index
  %r_n = tensor.dim %rows, %c0 : tensor<?x?xf32>
  %ids = func.call @__moe_cpu_iota(%r_n) : (index) -> tensor<?xi32>
  %r:3 = func.call @__moe_cpu_ep_pack_gather(%rows, %offsets, %ids, %ranks,
                                             %capacity)
      : (tensor<?x?xf32>, tensor<?xi32>, tensor<?xi32>, index, index)
      -> (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?xi32>)
  return %r#0, %r#1, %r#2 : tensor<?x?xf32>, tensor<?x?xi32>, tensor<?xi32>
}

// moe.ep_unpack: result [R, d] (R = r_n), result[offsets[s * El] + j] =
// returned[s * C + j] for the kept rows j of rank s's block, zero rows
// elsewhere (dropped rows, rows past offsets[E]).
func.func @__moe_cpu_ep_unpack(%returned: tensor<?x?xf32>,
                               %offsets: tensor<?xi32>, %r_n: index,
                               %ranks: index, %capacity: index)
    -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %src_n = tensor.dim %returned, %c0 : tensor<?x?xf32>
  %d = tensor.dim %returned, %c1 : tensor<?x?xf32>
  %el, %s_n = func.call @__moe_cpu_ep_layout(%offsets, %ranks)
      : (tensor<?xi32>, index) -> (index, index)
  %out_init = func.call @__moe_cpu_zeros(%r_n, %d)
      : (index, index) -> tensor<?x?xf32>
  %out = scf.for %s = %c0 to %s_n step %c1 iter_args(%oa = %out_init)
      -> (tensor<?x?xf32>) {
    %b:3 = func.call @__moe_cpu_ep_block(%offsets, %s, %el, %capacity)
        : (tensor<?xi32>, index, index, index) -> (index, index, index)
    %base = arith.muli %s, %capacity : index
    %ob = scf.for %j = %c0 to %b#1 step %c1 iter_args(%oc = %oa)
        -> (tensor<?x?xf32>) {
      %r = arith.addi %b#0, %j : index
      %src = arith.addi %base, %j : index
      %r_ok = func.call @__moe_cpu_in_range(%r, %r_n) : (index, index) -> i1
      %src_ok = func.call @__moe_cpu_in_range(%src, %src_n)
          : (index, index) -> i1
      %ok = arith.andi %r_ok, %src_ok : i1
      %oc2 = scf.if %ok -> (tensor<?x?xf32>) {
        %oc3 = func.call @__moe_cpu_copy_row(%oc, %r, %returned, %src)
            : (tensor<?x?xf32>, index, tensor<?x?xf32>, index)
            -> tensor<?x?xf32>
        scf.yield %oc3 : tensor<?x?xf32>
      } else {
        scf.yield %oc : tensor<?x?xf32>
      }
      scf.yield %oc2 : tensor<?x?xf32>
    }
    scf.yield %ob : tensor<?x?xf32>
  }
  return %out : tensor<?x?xf32>
}

// moe.ep_unpack with reduce: result [T, d], result[t] = sum over slots j in
// order of the unpacked rows [T * k, d] at rows_of[t, j] (-1 adds nothing):
// the combine with unit weights (1 * v is exact), accumulated in f32.
func.func @__moe_cpu_ep_unpack_reduce(%returned: tensor<?x?xf32>,
                                      %offsets: tensor<?xi32>,
                                      %rows_of: tensor<?x?xi32>,
                                      %ranks: index, %capacity: index)
    -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %one = arith.constant 1.0 : f32
  %t_n = tensor.dim %rows_of, %c0 : tensor<?x?xi32>
  %k = tensor.dim %rows_of, %c1 : tensor<?x?xi32>
  %r_n = arith.muli %t_n, %k : index
  %unpacked = func.call @__moe_cpu_ep_unpack(%returned, %offsets, %r_n,
                                             %ranks, %capacity)
      : (tensor<?x?xf32>, tensor<?xi32>, index, index, index)
      -> tensor<?x?xf32>
  %ones_empty = tensor.empty(%t_n, %k) : tensor<?x?xf32>
  %ones = linalg.fill ins(%one : f32) outs(%ones_empty : tensor<?x?xf32>)
      -> tensor<?x?xf32>
  %out = func.call @__moe_cpu_combine(%unpacked, %ones, %rows_of)
      : (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xi32>) -> tensor<?x?xf32>
  return %out : tensor<?x?xf32>
}

// moe.ep_queues: from counts [S, El] (i32), the queues of the local experts
// over the received rows [S * C]: expert e's queue, rank 0 first, is rows
// s * C + sum(counts[s, :e]) + j for j < counts[s, e]. token_ids [S * C]
// (i32, -1 past the queues), offsets [El + 1] (i32). A rank's counts past C
// (which a valid exchange never has) are cut at C, so that every row stays
// in its rank's block.
func.func @__moe_cpu_ep_queues(%counts: tensor<?x?xi32>, %capacity: index)
    -> (tensor<?xi32>, tensor<?xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c0_i32 = arith.constant 0 : i32
  %m1 = arith.constant -1 : i32
  %s_n = tensor.dim %counts, %c0 : tensor<?x?xi32>
  %el = tensor.dim %counts, %c1 : tensor<?x?xi32>
  %el1 = arith.addi %el, %c1 : index
  %slots = arith.muli %s_n, %capacity : index
  %ids_empty = tensor.empty(%slots) : tensor<?xi32>
  %ids_init = linalg.fill ins(%m1 : i32) outs(%ids_empty : tensor<?xi32>)
      -> tensor<?xi32>

  // Pass 1: the first row and the (cut) count of each (rank, expert).
  %starts_init = tensor.empty(%s_n, %el) : tensor<?x?xi32>
  %takes_init = tensor.empty(%s_n, %el) : tensor<?x?xi32>
  %p1:2 = scf.for %s = %c0 to %s_n step %c1
      iter_args(%starts = %starts_init, %takes = %takes_init)
      -> (tensor<?x?xi32>, tensor<?x?xi32>) {
    %base = arith.muli %s, %capacity : index
    %row:3 = scf.for %e = %c0 to %el step %c1
        iter_args(%sa = %starts, %ta = %takes, %used = %c0)
        -> (tensor<?x?xi32>, tensor<?x?xi32>, index) {
      %n32 = tensor.extract %counts[%s, %e] : tensor<?x?xi32>
      %n = arith.index_cast %n32 : i32 to index
      %n_pos = arith.maxsi %n, %c0 : index
      %room = arith.subi %capacity, %used : index
      %take = arith.minsi %n_pos, %room : index
      %start = arith.addi %base, %used : index
      %start32 = arith.index_cast %start : index to i32
      %take32 = arith.index_cast %take : index to i32
      %sa2 = tensor.insert %start32 into %sa[%s, %e] : tensor<?x?xi32>
      %ta2 = tensor.insert %take32 into %ta[%s, %e] : tensor<?x?xi32>
      %used2 = arith.addi %used, %take : index
      scf.yield %sa2, %ta2, %used2 : tensor<?x?xi32>, tensor<?x?xi32>, index
    }
    scf.yield %row#0, %row#1 : tensor<?x?xi32>, tensor<?x?xi32>
  }

  // Pass 2: the queues, expert by expert.
  %offs_empty = tensor.empty(%el1) : tensor<?xi32>
  %offs0 = tensor.insert %c0_i32 into %offs_empty[%c0] : tensor<?xi32>
  %p2:3 = scf.for %e = %c0 to %el step %c1
      iter_args(%ids = %ids_init, %offs = %offs0, %pos = %c0)
      -> (tensor<?xi32>, tensor<?xi32>, index) {
    %q:2 = scf.for %s = %c0 to %s_n step %c1
        iter_args(%ida = %ids, %pa = %pos) -> (tensor<?xi32>, index) {
      %start32 = tensor.extract %p1#0[%s, %e] : tensor<?x?xi32>
      %take32 = tensor.extract %p1#1[%s, %e] : tensor<?x?xi32>
      %take = arith.index_cast %take32 : i32 to index
      %idb = scf.for %j = %c0 to %take step %c1 iter_args(%idc = %ida)
          -> (tensor<?xi32>) {
        %j32 = arith.index_cast %j : index to i32
        %v = arith.addi %start32, %j32 : i32
        %at = arith.addi %pa, %j : index
        %idc2 = tensor.insert %v into %idc[%at] : tensor<?xi32>
        scf.yield %idc2 : tensor<?xi32>
      }
      %pa2 = arith.addi %pa, %take : index
      scf.yield %idb, %pa2 : tensor<?xi32>, index
    }
    %e1 = arith.addi %e, %c1 : index
    %pos32 = arith.index_cast %q#1 : index to i32
    %offs2 = tensor.insert %pos32 into %offs[%e1] : tensor<?xi32>
    scf.yield %q#0, %offs2, %q#1 : tensor<?xi32>, tensor<?xi32>, index
  }
  return %p2#0, %p2#1 : tensor<?xi32>, tensor<?xi32>
}

// moe.gather_rows: result [M, d], result[i] = source[indices[i]], a zero row
// for -1 (or any index outside [0, N)).
func.func @__moe_cpu_gather_rows(%source: tensor<?x?xf32>,
                                 %indices: tensor<?xi32>) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = tensor.dim %source, %c0 : tensor<?x?xf32>
  %d = tensor.dim %source, %c1 : tensor<?x?xf32>
  %m = tensor.dim %indices, %c0 : tensor<?xi32>
  %out_init = func.call @__moe_cpu_zeros(%m, %d)
      : (index, index) -> tensor<?x?xf32>
  %out = scf.for %i = %c0 to %m step %c1 iter_args(%oa = %out_init)
      -> (tensor<?x?xf32>) {
    %v32 = tensor.extract %indices[%i] : tensor<?xi32>
    %v = arith.index_cast %v32 : i32 to index
    %ok = func.call @__moe_cpu_in_range(%v, %n) : (index, index) -> i1
    %ob = scf.if %ok -> (tensor<?x?xf32>) {
      %oc = func.call @__moe_cpu_copy_row(%oa, %i, %source, %v)
          : (tensor<?x?xf32>, index, tensor<?x?xf32>, index) -> tensor<?x?xf32>
      scf.yield %oc : tensor<?x?xf32>
    } else {
      scf.yield %oa : tensor<?x?xf32>
    }
    scf.yield %ob : tensor<?x?xf32>
  }
  return %out : tensor<?x?xf32>
}

// moe.scatter_rows: result [N, d] (N = n_n) zero, then result[indices[i]] =
// source[i] for every index in [0, N) (-1 writes nothing).
func.func @__moe_cpu_scatter_rows(%source: tensor<?x?xf32>,
                                  %indices: tensor<?xi32>, %n_n: index)
    -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %src_n = tensor.dim %source, %c0 : tensor<?x?xf32>
  %d = tensor.dim %source, %c1 : tensor<?x?xf32>
  %idx_n = tensor.dim %indices, %c0 : tensor<?xi32>
  %m = arith.minsi %src_n, %idx_n : index
  %out_init = func.call @__moe_cpu_zeros(%n_n, %d)
      : (index, index) -> tensor<?x?xf32>
  %out = scf.for %i = %c0 to %m step %c1 iter_args(%oa = %out_init)
      -> (tensor<?x?xf32>) {
    %v32 = tensor.extract %indices[%i] : tensor<?xi32>
    %v = arith.index_cast %v32 : i32 to index
    %ok = func.call @__moe_cpu_in_range(%v, %n_n) : (index, index) -> i1
    %ob = scf.if %ok -> (tensor<?x?xf32>) {
      %oc = func.call @__moe_cpu_copy_row(%oa, %v, %source, %i)
          : (tensor<?x?xf32>, index, tensor<?x?xf32>, index) -> tensor<?x?xf32>
      scf.yield %oc : tensor<?x?xf32>
    } else {
      scf.yield %oa : tensor<?x?xf32>
    }
    scf.yield %ob : tensor<?x?xf32>
  }
  return %out : tensor<?x?xf32>
}
