//===- moe_layer_example.cpp - A compiled MoE layer from C++ -----*- C++
//-*-===//
//
// Runs a layer compiled by moe-compile (docs/gpu-path.md section 2) through its
// generated entry points: random bf16 inputs, forward, backward with random
// cotangents, then every output and gradient against a host reference in
// double (docs/cpu-path.md section 2) that uses the layer's own routing
// decisions. Device memory, copies and the stream come from libmoe_runtime.
// Also shows the error contract: a null or misaligned pointer is refused with
// a status and a message before any work starts. A layer of dynamic token
// count (kMaxTokens > 0) runs all of it at several T, and a T outside its
// bound is refused too.
//
// The layer's parameter list comes from its manifest (layer_table.h, written by
// gen_layer_table.py), so the saved set can change without touching this file.
//
// Prints one line per check and "N passed, M failed" last; exits 1 on any
// failure.
//
//===----------------------------------------------------------------------===//

#include "layer_table.h"
#include "moe/Runtime/Runtime.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

using moe_layer::DType;
using moe_layer::Param;

constexpr double kOutputTolerance = 1e-2;   // docs/benchmarks.md
constexpr double kGradientTolerance = 2e-2; // relative Frobenius error

int passed = 0, failed = 0;

void report(bool ok, const std::string &what) {
  (ok ? passed : failed) += 1;
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
}

// bf16 is the upper half of an f32; rounding to nearest even.
uint16_t toBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if (std::isnan(value))
    return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);
  return uint16_t(bits >> 16);
}

float fromBf16(uint16_t half) {
  uint32_t bits = uint32_t(half) << 16;
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

size_t elementSize(DType dtype) {
  return dtype == moe_layer::BF16 || dtype == moe_layer::F16 ? 2 : 4;
}

/// One parameter's host copy and device buffer.
struct Tensor {
  const Param *param = nullptr;
  size_t count = 0;
  std::vector<uint8_t> host;
  moeDevicePtr device = 0;
  bool owned = false;

  size_t bytes() const { return count * elementSize(param->dtype); }

  double get(size_t i) const {
    switch (param->dtype) {
    case moe_layer::BF16: {
      uint16_t v;
      std::memcpy(&v, &host[2 * i], 2);
      return fromBf16(v);
    }
    case moe_layer::F32: {
      float v;
      std::memcpy(&v, &host[4 * i], 4);
      return v;
    }
    case moe_layer::I32: {
      int32_t v;
      std::memcpy(&v, &host[4 * i], 4);
      return v;
    }
    default:
      return NAN; // f16 is not used by the GPU path
    }
  }

  void set(size_t i, double value) {
    if (param->dtype == moe_layer::BF16) {
      uint16_t v = toBf16(float(value));
      std::memcpy(&host[2 * i], &v, 2);
    } else if (param->dtype == moe_layer::F32) {
      float v = float(value);
      std::memcpy(&host[4 * i], &v, 4);
    } else if (param->dtype == moe_layer::I32) {
      int32_t v = int32_t(value);
      std::memcpy(&host[4 * i], &v, 4);
    }
  }

  /// The values as doubles (bf16 inputs exactly as the device sees them).
  std::vector<double> values() const {
    std::vector<double> out(count);
    for (size_t i = 0; i < count; ++i)
      out[i] = get(i);
    return out;
  }
};

bool ok(moeStatus status, const char *what) {
  if (status == MOE_SUCCESS)
    return true;
  std::printf("FAIL %s: %s: %s\n", what, moeStatusString(status),
              moeGetLastErrorMessage());
  ++failed;
  return false;
}

/// The leading size of `param` at T tokens.
int64_t leadingSize(const Param &param, int64_t T) {
  return param.rowsPerToken > 0 ? param.rowsPerToken * T : param.shape[0];
}

Tensor makeTensor(const Param &param, int64_t T) {
  Tensor t;
  t.param = &param;
  t.count = 1;
  for (int i = 0; i < param.rank; ++i)
    t.count *= size_t(i == 0 ? leadingSize(param, T) : param.shape[i]);
  t.host.assign(t.bytes(), 0);
  return t;
}

/// The layer argument name ("x", "w_router", ...) of forward parameter `param`:
/// from the manifest's "inputs", else by position (x, w_router, [router_bias],
/// w_gate_up, w_down, [shared_gate_up, shared_down]).
std::string layerName(const char *param, int inputIndex) {
  for (int i = 0; i < moe_layer::kNumInputs; ++i)
    if (std::strcmp(moe_layer::kInputs[i].param, param) == 0)
      return moe_layer::kInputs[i].layerName;
  std::vector<std::string> order = {"x", "w_router"};
  if (moe_layer::kConfig.hasBias)
    order.push_back("router_bias");
  order.push_back("w_gate_up");
  order.push_back("w_down");
  if (moe_layer::kConfig.sharedN > 0) {
    order.push_back("shared_gate_up");
    order.push_back("shared_down");
  }
  return inputIndex < int(order.size()) ? order[inputIndex] : param;
}

std::string canonical(const std::string &name) {
  if (name == "bias")
    return "router_bias";
  if (name == "shared_w_gate_up")
    return "shared_gate_up";
  if (name == "shared_w_down")
    return "shared_down";
  return name;
}

double silu(double v) { return v / (1.0 + std::exp(-v)); }
double siluGrad(double v) {
  double s = 1.0 / (1.0 + std::exp(-v));
  return s * (1.0 + v * (1.0 - s));
}

/// The host reference: forward and backward in double, with the given experts.
struct Reference {
  std::vector<double> out, logits;
  std::map<std::string, std::vector<double>> grads;
};

Reference reference(int64_t T,
                    const std::map<std::string, std::vector<double>> &in,
                    const std::vector<int> &experts,
                    const std::vector<double> &dout,
                    const std::vector<double> &dlogits) {
  const auto &c = moe_layer::kConfig;
  const int64_t d = c.d, n = c.n, E = c.E, k = c.k, m = c.sharedN;
  const auto &x = in.at("x"), &wr = in.at("w_router");
  const auto &wgu = in.at("w_gate_up"), &wd = in.at("w_down");
  Reference r;
  r.out.assign(T * d, 0.0);
  r.logits.assign(T * E, 0.0);
  auto &dx = r.grads["x"];
  auto &dwr = r.grads["w_router"];
  auto &dwgu = r.grads["w_gate_up"];
  auto &dwd = r.grads["w_down"];
  dx.assign(T * d, 0.0);
  dwr.assign(d * E, 0.0);
  dwgu.assign(E * d * 2 * n, 0.0);
  dwd.assign(E * n * d, 0.0);

  std::vector<double> h(2 * n), a(n), ga(n), dh(2 * n), s(E), ds(E);
  std::vector<double> u(k), w(k), dw(k);
  for (int64_t t = 0; t < T; ++t) {
    const double *xt = &x[t * d];
    // Router: logits, scores, the weights of our experts.
    for (int64_t e = 0; e < E; ++e) {
      double acc = 0;
      for (int64_t i = 0; i < d; ++i)
        acc += xt[i] * wr[i * E + e];
      r.logits[t * E + e] = acc;
    }
    if (c.sigmoid) {
      for (int64_t e = 0; e < E; ++e)
        s[e] = 1.0 / (1.0 + std::exp(-r.logits[t * E + e]));
    } else {
      double mx = r.logits[t * E];
      for (int64_t e = 1; e < E; ++e)
        mx = std::max(mx, r.logits[t * E + e]);
      double sum = 0;
      for (int64_t e = 0; e < E; ++e)
        sum += s[e] = std::exp(r.logits[t * E + e] - mx);
      for (int64_t e = 0; e < E; ++e)
        s[e] /= sum;
    }
    double S = 0;
    for (int64_t j = 0; j < k; ++j)
      S += u[j] = s[experts[t * k + j]];
    for (int64_t j = 0; j < k; ++j)
      w[j] = (c.renormalize && S != 0 ? u[j] / S : u[j]) * c.scaling;

    // Experts: out += w_j * swiglu(x wgu[e]) wd[e]; their backward.
    for (int64_t j = 0; j < k; ++j) {
      int64_t e = experts[t * k + j];
      const double *G = &wgu[e * d * 2 * n], *D = &wd[e * n * d];
      for (int64_t q = 0; q < 2 * n; ++q) {
        double acc = 0;
        for (int64_t i = 0; i < d; ++i)
          acc += xt[i] * G[i * 2 * n + q];
        h[q] = acc;
      }
      for (int64_t q = 0; q < n; ++q)
        a[q] = silu(h[q]) * h[n + q];
      for (int64_t i = 0; i < d; ++i) {
        double acc = 0;
        for (int64_t q = 0; q < n; ++q)
          acc += a[q] * D[q * d + i];
        r.out[t * d + i] += w[j] * acc;
      }
      // ga = dout[t] wd[e]^T; d_weight = <ga, a>; dy = w_j dout[t].
      double dot = 0;
      for (int64_t q = 0; q < n; ++q) {
        double acc = 0;
        for (int64_t i = 0; i < d; ++i)
          acc += dout[t * d + i] * D[q * d + i];
        ga[q] = acc;
        dot += acc * a[q];
      }
      dw[j] = dot;
      for (int64_t q = 0; q < n; ++q)
        for (int64_t i = 0; i < d; ++i)
          dwd[e * n * d + q * d + i] += a[q] * w[j] * dout[t * d + i];
      for (int64_t q = 0; q < n; ++q) {
        double da = w[j] * ga[q];
        dh[q] = da * h[n + q] * siluGrad(h[q]);
        dh[n + q] = da * silu(h[q]);
      }
      for (int64_t i = 0; i < d; ++i) {
        double acc = 0;
        for (int64_t q = 0; q < 2 * n; ++q) {
          dwgu[e * d * 2 * n + i * 2 * n + q] += xt[i] * dh[q];
          acc += dh[q] * G[i * 2 * n + q];
        }
        dx[t * d + i] += acc;
      }
    }

    // Router backward: the weights' gradient to the scores, then the logits.
    std::fill(ds.begin(), ds.end(), 0.0);
    double dotDu = 0;
    for (int64_t j = 0; j < k; ++j)
      dotDu += dw[j] * u[j];
    for (int64_t j = 0; j < k; ++j) {
      double du =
          c.renormalize
              ? (S != 0 ? c.scaling * (dw[j] / S - dotDu / (S * S)) : 0.0)
              : c.scaling * dw[j];
      ds[experts[t * k + j]] += du;
    }
    double inner = 0;
    for (int64_t e = 0; e < E; ++e)
      inner += ds[e] * s[e];
    for (int64_t e = 0; e < E; ++e) {
      double dl =
          c.sigmoid ? ds[e] * s[e] * (1 - s[e]) : s[e] * (ds[e] - inner);
      dl += dlogits.empty() ? 0.0 : dlogits[t * E + e];
      for (int64_t i = 0; i < d; ++i) {
        dx[t * d + i] += dl * wr[i * E + e];
        dwr[i * E + e] += xt[i] * dl;
      }
    }

    // The shared expert on every token.
    if (m > 0) {
      const auto &sg = in.at("shared_gate_up"), &sd = in.at("shared_down");
      auto &dsg = r.grads["shared_gate_up"];
      auto &dsd = r.grads["shared_down"];
      dsg.resize(d * 2 * m, 0.0);
      dsd.resize(m * d, 0.0);
      std::vector<double> hs(2 * m), as(m), gas(m), dhs(2 * m);
      for (int64_t q = 0; q < 2 * m; ++q) {
        double acc = 0;
        for (int64_t i = 0; i < d; ++i)
          acc += xt[i] * sg[i * 2 * m + q];
        hs[q] = acc;
      }
      for (int64_t q = 0; q < m; ++q)
        as[q] = silu(hs[q]) * hs[m + q];
      for (int64_t i = 0; i < d; ++i) {
        double acc = 0;
        for (int64_t q = 0; q < m; ++q)
          acc += as[q] * sd[q * d + i];
        r.out[t * d + i] += acc;
      }
      for (int64_t q = 0; q < m; ++q) {
        double acc = 0;
        for (int64_t i = 0; i < d; ++i) {
          acc += dout[t * d + i] * sd[q * d + i];
          dsd[q * d + i] += as[q] * dout[t * d + i];
        }
        dhs[q] = acc * hs[m + q] * siluGrad(hs[q]);
        dhs[m + q] = acc * silu(hs[q]);
      }
      for (int64_t i = 0; i < d; ++i)
        for (int64_t q = 0; q < 2 * m; ++q) {
          dsg[i * 2 * m + q] += xt[i] * dhs[q];
          dx[t * d + i] += dhs[q] * sg[i * 2 * m + q];
        }
    }
  }
  return r;
}

double relError(const std::vector<double> &ours,
                const std::vector<double> &ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ours[i]))
      return NAN;
    num += (ours[i] - ref[i]) * (ours[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den == 0 ? (num == 0 ? 0 : INFINITY) : std::sqrt(num / den);
}

void compare(const char *what, const std::vector<double> &ours,
             const std::vector<double> &ref, double tolerance) {
  double err = relError(ours, ref);
  char line[256];
  std::snprintf(line, sizeof(line),
                "%-22s relative error %.3e (tolerance %.0e)", what, err,
                tolerance);
  report(err <= tolerance, line); // NaN fails
}

/// Every check of the layer at T tokens; false when it cannot go on.
bool runAt(moeStream stream, int64_t T) {
  const auto &c = moe_layer::kConfig;
  std::printf("-- T = %lld\n", (long long)T);
  // Forward parameters: inputs random, outputs and saved tensors allocated.
  std::mt19937_64 rng(2024 + uint64_t(T));
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<Tensor> fwd;
  for (int i = 0; i < moe_layer::kNumForward; ++i)
    fwd.push_back(makeTensor(moe_layer::kForward[i], T));
  std::map<std::string, std::vector<double>> inputs; // by layer name
  std::map<std::string, std::string> paramToLayer;
  int inputIndex = 0;
  for (Tensor &t : fwd) {
    if (std::strcmp(t.param->role, "input") == 0) {
      std::string name = canonical(layerName(t.param->name, inputIndex++));
      double stddev = name == "x" ? 1.0 : name == "router_bias" ? 0.01 : 0.02;
      for (size_t i = 0; i < t.count; ++i)
        t.set(i, stddev * normal(rng));
      inputs[name] = t.values();
      paramToLayer[t.param->name] = name;
    }
    if (!ok(moeMemAlloc(t.bytes(), &t.device), "moeMemAlloc"))
      return false;
    t.owned = true;
    if (std::strcmp(t.param->role, "input") == 0 &&
        !ok(moeMemcpyHtoDAsync(t.device, t.host.data(), t.bytes(), stream),
            "moeMemcpyHtoDAsync"))
      return false;
  }
  auto findForward = [&](const std::string &name) -> Tensor * {
    for (Tensor &t : fwd)
      if (name == t.param->name)
        return &t;
    return nullptr;
  };

  // Backward parameters: saved ones are the forward's buffers.
  std::vector<Tensor> bwd;
  for (int i = 0; i < moe_layer::kNumBackward; ++i)
    bwd.push_back(makeTensor(moe_layer::kBackward[i], T));
  std::vector<double> dout, dlogits;
  for (Tensor &t : bwd) {
    std::string role = t.param->role;
    if (role == "saved") {
      Tensor *source =
          findForward(t.param->source[0] ? t.param->source : t.param->name);
      if (!source) {
        report(false, std::string("backward saved ") + t.param->name +
                          " names no forward parameter");
        return false;
      }
      t.device = source->device;
      continue;
    }
    if (role == "cotangent") {
      bool isOut = std::strcmp(t.param->source, "result0") == 0;
      for (size_t i = 0; i < t.count; ++i)
        t.set(i, (isOut ? 1.0 : 0.1) * normal(rng));
      (isOut ? dout : dlogits) = t.values();
    }
    if (!ok(moeMemAlloc(t.bytes(), &t.device), "moeMemAlloc"))
      return false;
    t.owned = true;
    if (role == "cotangent" &&
        !ok(moeMemcpyHtoDAsync(t.device, t.host.data(), t.bytes(), stream),
            "moeMemcpyHtoDAsync"))
      return false;
  }

  std::vector<void *> fwdPtrs, bwdPtrs;
  for (Tensor &t : fwd)
    fwdPtrs.push_back(reinterpret_cast<void *>(t.device));
  for (Tensor &t : bwd)
    bwdPtrs.push_back(reinterpret_cast<void *>(t.device));
  std::printf("workspace: forward %lld bytes, backward %lld bytes\n",
              (long long)moe_layer::forwardWorkspaceBytes(T),
              (long long)moe_layer::backwardWorkspaceBytes(T));

  // The calls: enqueued on our stream, then waited for.
  int status = moe_layer::forward(stream, T, fwdPtrs.data());
  report(status == 0, std::string("forward on a stream: ") +
                          moeStatusString(moeStatus(status)) + " " +
                          (status ? moeGetLastErrorMessage() : ""));
  status = moe_layer::backward(stream, T, bwdPtrs.data());
  report(status == 0, std::string("backward on a stream: ") +
                          moeStatusString(moeStatus(status)) + " " +
                          (status ? moeGetLastErrorMessage() : ""));
  for (Tensor &t : fwd)
    if (std::strcmp(t.param->role, "input") != 0)
      ok(moeMemcpyDtoHAsync(t.host.data(), t.device, t.bytes(), stream),
         "moeMemcpyDtoHAsync");
  for (Tensor &t : bwd)
    if (std::strcmp(t.param->role, "gradient") == 0)
      ok(moeMemcpyDtoHAsync(t.host.data(), t.device, t.bytes(), stream),
         "moeMemcpyDtoHAsync");
  if (!ok(moeStreamSynchronize(stream), "moeStreamSynchronize (kernel fault?)"))
    return false;

  // Our routing decisions, for the reference.
  Tensor *expertsT = nullptr;
  for (Tensor &t : fwd)
    if (std::strcmp(t.param->role, "saved") == 0 &&
        t.param->dtype == moe_layer::I32 && t.param->rank == 2 &&
        leadingSize(*t.param, T) == T && t.param->shape[1] == c.k &&
        std::strstr(t.param->name, "expert"))
      expertsT = &t;
  if (!expertsT) {
    report(false, "the manifest saves no experts [T,k] i32");
    return false;
  }
  std::vector<int> experts(expertsT->count);
  bool inRange = true;
  for (size_t i = 0; i < experts.size(); ++i) {
    experts[i] = int(expertsT->get(i));
    inRange &= experts[i] >= 0 && experts[i] < c.E;
  }
  report(inRange, "experts within [0, E)");
  if (!inRange)
    return false;

  Reference ref = reference(T, inputs, experts, dout, dlogits);
  Tensor *out = findForward("result0");
  Tensor *logits = findForward("result1");
  if (out)
    compare("out", out->values(), ref.out, kOutputTolerance);
  if (logits)
    compare("router logits", logits->values(), ref.logits, kOutputTolerance);
  for (Tensor &t : bwd) {
    if (std::strcmp(t.param->role, "gradient") != 0)
      continue;
    auto it = paramToLayer.find(t.param->source);
    std::string name = it != paramToLayer.end() ? it->second : t.param->source;
    auto refIt = ref.grads.find(name);
    if (refIt == ref.grads.end()) {
      report(false, "no reference gradient for " + name);
      continue;
    }
    compare(("d_" + name).c_str(), t.values(), refIt->second,
            kGradientTolerance);
  }

  // The same forward with a null stream (the runtime's own, waited for) gives
  // the same bits.
  if (out) {
    std::vector<uint8_t> first = out->host;
    status = moe_layer::forward(nullptr, T, fwdPtrs.data());
    report(status == 0, "forward with a null stream");
    ok(moeMemcpyDtoHAsync(out->host.data(), out->device, out->bytes(), stream),
       "moeMemcpyDtoHAsync");
    ok(moeStreamSynchronize(stream), "moeStreamSynchronize");
    report(first == out->host, "null-stream forward bitwise identical to the "
                               "stream forward");
  }

  // Errors: a null pointer and a misaligned one are refused before any work,
  // with a status and a message naming the parameter.
  {
    std::vector<void *> bad = fwdPtrs;
    bad[0] = nullptr;
    moeClearLastError();
    status = moe_layer::forward(stream, T, bad.data());
    std::string message = moeGetLastErrorMessage();
    std::printf("  null %s: %s: %s\n", fwd[0].param->name,
                moeStatusString(moeStatus(status)), message.c_str());
    report(status == MOE_ERROR_INVALID_ARGUMENT && !message.empty(),
           "a null pointer gives MOE_ERROR_INVALID_ARGUMENT and a message");
    bad[0] = static_cast<char *>(fwdPtrs[0]) + 2;
    moeClearLastError();
    status = moe_layer::forward(stream, T, bad.data());
    message = moeGetLastErrorMessage();
    std::printf("  misaligned %s: %s: %s\n", fwd[0].param->name,
                moeStatusString(moeStatus(status)), message.c_str());
    report(status == MOE_ERROR_MISALIGNED && !message.empty(),
           "a misaligned pointer gives MOE_ERROR_MISALIGNED and a message");
  }

  ok(moeStreamSynchronize(stream), "moeStreamSynchronize");
  for (Tensor &t : fwd)
    if (t.owned)
      moeMemFree(t.device);
  for (Tensor &t : bwd)
    if (t.owned)
      moeMemFree(t.device);
  return true;
}

} // namespace

int main() {
  const auto &c = moe_layer::kConfig;
  std::printf(
      "layer %s: T=%lld%s d=%lld n=%lld E=%lld k=%lld %s%s, shared m=%lld\n",
      moe_layer::kName, (long long)c.T,
      moe_layer::kMaxTokens ? " (the bound of a dynamic T)" : "",
      (long long)c.d, (long long)c.n, (long long)c.E, (long long)c.k,
      c.sigmoid ? "sigmoid" : "softmax", c.renormalize ? " renormalised" : "",
      (long long)c.sharedN);
  if (!ok(moeInit(), "moeInit (is there a GPU and a driver?)"))
    return 1;
  moeStream stream = nullptr;
  if (!ok(moeStreamCreate(&stream), "moeStreamCreate"))
    return 1;
  // One compiled layer of dynamic T at several token counts up to its bound.
  std::vector<int64_t> counts = {c.T};
  if (moe_layer::kMaxTokens > 0) {
    counts = {1, 37, moe_layer::kMaxTokens};
    counts.erase(
        std::remove_if(counts.begin(), counts.end(),
                       [](int64_t t) { return t > moe_layer::kMaxTokens; }),
        counts.end());
  }
  for (int64_t T : counts)
    if (!runAt(stream, T))
      break;
  // A T outside [1, bound] is refused before anything else is looked at.
  if (moe_layer::kMaxTokens > 0)
    for (int64_t T : {int64_t(0), moe_layer::kMaxTokens + 1}) {
      std::vector<void *> none(
          std::max(moe_layer::kNumForward, moe_layer::kNumBackward), nullptr);
      moeClearLastError();
      int status = moe_layer::forward(stream, T, none.data());
      std::string message = moeGetLastErrorMessage();
      std::printf("  T = %lld: %s: %s\n", (long long)T,
                  moeStatusString(moeStatus(status)), message.c_str());
      report(status == MOE_ERROR_INVALID_ARGUMENT &&
                 message.find("token count") != std::string::npos,
             "a T outside the bound gives MOE_ERROR_INVALID_ARGUMENT");
      report(moe_layer::forwardWorkspaceBytes(T) == -1, "its workspace is -1");
    }
  moeStreamDestroy(stream);
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
