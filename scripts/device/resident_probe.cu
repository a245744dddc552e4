// A resident kernel's tick, measured: one persistent block polls a mailbox in mapped
// pinned host memory, runs one step of bench_lstm's shape (2 LSTM layers of 128 units on
// 32 features, then a 128 -> 1 head) with the recurrent state kept on the device, writes
// the answer back to the mailbox and flips a flag the host polls. No launch, no copy
// call, no stream synchronisation per tick. Decision data for the GPU's resident mode:
// what the round trip costs on this machine, with and without the step's compute, and
// whether the answers equal a host reference.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o resident_probe scripts/device/resident_probe.cu
//   ./resident_probe [TICKS]          # prints one JSON line per case
//
// Cases: `echo` (the kernel copies x[0] back: the mailbox round trip alone), `lstm_l2`
// (the step, weights read from global memory, L2-resident after the first tick),
// `lstm_smem_fp16` (the step, layer 2's recurrent weights resident in shared memory as
// FP16 (128 KiB), the rest from L2: what "weights on chip" buys where one SM holds part).
// Each host wait is bounded (1 s): a kernel that stops answering ends the probe with an
// error, never a hang.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_fp16.h>

constexpr int F = 32;       // features
constexpr int H = 128;      // hidden units
constexpr int G = 4 * H;    // gate rows (i, o, f, c as ONNX orders them)
constexpr int THREADS = G;  // one thread per gate row

#define CHECK(call)                                                                 \
  do {                                                                              \
    cudaError_t e = (call);                                                         \
    if (e != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,             \
                   cudaGetErrorString(e));                                          \
      std::exit(2);                                                                 \
    }                                                                               \
  } while (0)

struct Mailbox {
  int in;        // the tick the host wrote (-1: exit)
  int pad0[31];  // keep the flags on separate 128-byte lines
  int out;       // the tick the kernel answered
  int pad1[31];
  float x[F];    // the tick's features
  float y;       // the answer
};

// Matrices are stored transposed, [k][G]: a warp's 32 threads (32 consecutive gate rows)
// read 32 consecutive floats of one k, one 128-byte line (row-major, [G][k], they would
// read 32 lines a load, and shared memory would serve the same bank 32 times).
struct Weights {
  const float* w1;  // [F][G]
  const float* r1;  // [H][G]
  const float* b1;  // [G]
  const float* w2;  // [H][G]
  const float* r2;  // [H][G]
  const float* b2;  // [G]
  const float* head;  // [H]
  float head_b;
};

__device__ __forceinline__ float sigmoid(float v) { return 1.f / (1.f + __expf(-v)); }

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release(int* p, int v) {
  asm volatile("st.release.sys.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// One LSTM cell over `gates` (pre-activations, ONNX order i, o, f, c): thread j < H
// updates h[j], c[j].
__device__ void cell(const float* gates, float* h, float* c) {
  int j = threadIdx.x;
  if (j < H) {
    float i = sigmoid(gates[j]), o = sigmoid(gates[H + j]), f = sigmoid(gates[2 * H + j]);
    float g = tanhf(gates[3 * H + j]);
    float cj = f * c[j] + i * g;
    c[j] = cj;
    h[j] = o * tanhf(cj);
  }
}

// mode 0: echo; 1: the step, weights from global memory; 2: the step, layer 2 and the
// head from shared memory (FP16).
__global__ void resident(Mailbox* box, Weights w, int mode) {
  extern __shared__ __half resident_w[];  // mode 2: r2 [H][G] as FP16
  __shared__ float x[F], h1[H], c1[H], h2[H], c2[H], gates[G];
  __shared__ int tick;
  int r = threadIdx.x;
  if (r < H) h1[r] = c1[r] = h2[r] = c2[r] = 0.f;
  if (mode == 2) {
    for (int k = r; k < G * H; k += THREADS) resident_w[k] = __float2half(w.r2[k]);
  }
  int last = 0;
  __syncthreads();
  for (;;) {
    if (r == 0) {
      int t;
      while ((t = load_acquire(&box->in)) == last) {
      }
      tick = t;
    }
    __syncthreads();
    int t = tick;
    if (t < 0) return;
    last = t;
    if (mode == 0) {
      if (r == 0) {
        box->y = reinterpret_cast<volatile float*>(box->x)[0];
        store_release(&box->out, t);
      }
      __syncthreads();  // every thread has read `tick` before thread 0 writes the next
      continue;
    }
    if (r < F) x[r] = reinterpret_cast<volatile float*>(box->x)[r];
    __syncthreads();
    // Layer 1: gates = b1 + W1 x + R1 h1.
    float acc = w.b1[r];
#pragma unroll 8
    for (int k = 0; k < F; ++k) acc += w.w1[k * G + r] * x[k];
#pragma unroll 8
    for (int k = 0; k < H; ++k) acc += w.r1[k * G + r] * h1[k];
    gates[r] = acc;
    __syncthreads();
    cell(gates, h1, c1);
    __syncthreads();
    // Layer 2: gates = b2 + W2 h1 + R2 h2.
    acc = w.b2[r];
    if (mode == 2) {
#pragma unroll 8
      for (int k = 0; k < H; ++k)
        acc += w.w2[k * G + r] * h1[k] + __half2float(resident_w[k * G + r]) * h2[k];
    } else {
#pragma unroll 8
      for (int k = 0; k < H; ++k) acc += w.w2[k * G + r] * h1[k] + w.r2[k * G + r] * h2[k];
    }
    gates[r] = acc;
    __syncthreads();
    cell(gates, h2, c2);
    __syncthreads();
    // The head: one warp's sum over h2.
    if (r < 32) {
      float s = 0.f;
      for (int k = r; k < H; k += 32) s += w.head[k] * h2[k];
      for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
      if (r == 0) {
        box->y = s + w.head_b;
        store_release(&box->out, t);
      }
    }
    __syncthreads();
  }
}

// The host reference of the same step (double accumulation; mode 2 rounds layer 2's
// recurrent weights to FP16 as the kernel holds them).
struct Reference {
  std::vector<float> h1 = std::vector<float>(H), c1 = std::vector<float>(H),
                     h2 = std::vector<float>(H), c2 = std::vector<float>(H);
  static float sig(double v) { return float(1.0 / (1.0 + std::exp(-v))); }
  static void step(const std::vector<double>& gates, std::vector<float>& h, std::vector<float>& c) {
    for (int j = 0; j < H; ++j) {
      float i = sig(gates[j]), o = sig(gates[H + j]), f = sig(gates[2 * H + j]);
      float g = float(std::tanh(gates[3 * H + j]));
      c[j] = f * c[j] + i * g;
      h[j] = o * float(std::tanh(c[j]));
    }
  }
  float run(const std::vector<float>* host, const float* x, bool fp16) {
    auto q = [&](float v) { return fp16 ? __half2float(__float2half(v)) : v; };
    std::vector<double> gates(G);
    for (int r = 0; r < G; ++r) {
      double a = host[2][r];
      for (int k = 0; k < F; ++k) a += double(host[0][k * G + r]) * x[k];
      for (int k = 0; k < H; ++k) a += double(host[1][k * G + r]) * h1[k];
      gates[r] = a;
    }
    step(gates, h1, c1);
    for (int r = 0; r < G; ++r) {
      double a = host[5][r];
      for (int k = 0; k < H; ++k)
        a += double(host[3][k * G + r]) * h1[k] + double(q(host[4][k * G + r])) * h2[k];
      gates[r] = a;
    }
    step(gates, h2, c2);
    double y = host[7][0];
    for (int k = 0; k < H; ++k) y += double(host[6][k]) * h2[k];
    return float(y);
  }
};

static unsigned long long lcg = 0x9E3779B97F4A7C15ull;
static float uniform(float scale) {
  lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
  return scale * (float((lcg >> 40) & 0xFFFFFF) / float(0xFFFFFF) * 2.f - 1.f);
}

int main(int argc, char** argv) {
  int ticks = argc > 1 ? std::atoi(argv[1]) : 20000;
  int warmup = 1000;
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  CHECK(cudaSetDeviceFlags(cudaDeviceMapHost));
  // Weights: w1, r1, b1, w2, r2, b2, head, head bias.
  const size_t sizes[8] = {size_t(G) * F, size_t(G) * H, G, size_t(G) * H, size_t(G) * H, G, H, 1};
  std::vector<float> host[8];
  float* device[8];
  for (int i = 0; i < 8; ++i) {
    host[i].resize(sizes[i]);
    for (auto& v : host[i]) v = uniform(0.2f);
    CHECK(cudaMalloc(&device[i], sizes[i] * sizeof(float)));
    CHECK(cudaMemcpy(device[i], host[i].data(), sizes[i] * sizeof(float), cudaMemcpyHostToDevice));
  }
  Weights w{device[0], device[1], device[2], device[3], device[4], device[5], device[6], host[7][0]};
  Mailbox* box;
  Mailbox* dbox;
  CHECK(cudaHostAlloc(reinterpret_cast<void**>(&box), sizeof(Mailbox), cudaHostAllocMapped));
  CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dbox), box, 0));
  const size_t smem2 = size_t(G) * H * sizeof(__half);  // 128 KiB
  const char* names[3] = {"echo", "lstm_l2", "lstm_smem_fp16"};
  for (int mode = 0; mode < 3; ++mode) {
    size_t smem = mode == 2 ? smem2 : 0;
    if (smem > size_t(prop.sharedMemPerBlockOptin)) {
      std::printf("{\"case\": \"%s\", \"skipped\": \"needs %zu bytes of shared memory, one block "
                  "may have %zu\"}\n", names[mode], smem, size_t(prop.sharedMemPerBlockOptin));
      continue;
    }
    if (smem > 48 * 1024)
      CHECK(cudaFuncSetAttribute(resident, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    std::memset(box, 0, sizeof(Mailbox));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    resident<<<1, THREADS, smem, stream>>>(dbox, w, mode);
    CHECK(cudaGetLastError());
    Reference reference;
    std::vector<double> took;
    took.reserve(ticks);
    double worst = 0;
    bool failed = false;
    std::vector<float> x(F);
    for (int t = 1; t <= warmup + ticks && !failed; ++t) {
      for (int k = 0; k < F; ++k) x[k] = uniform(1.f);
      auto start = std::chrono::steady_clock::now();
      std::memcpy(box->x, x.data(), sizeof(float) * F);
      __atomic_store_n(&box->in, t, __ATOMIC_RELEASE);
      while (__atomic_load_n(&box->out, __ATOMIC_ACQUIRE) != t) {
        if (std::chrono::steady_clock::now() - start > std::chrono::seconds(1)) {
          std::printf("{\"case\": \"%s\", \"error\": \"no answer to tick %d within 1 s\"}\n",
                      names[mode], t);
          std::fflush(stdout);
          std::_Exit(3);
        }
      }
      float y = box->y;
      auto end = std::chrono::steady_clock::now();
      if (t > warmup) took.push_back(std::chrono::duration<double, std::micro>(end - start).count());
      float want = mode == 0 ? x[0] : reference.run(host, x.data(), mode == 2);
      double rel = std::fabs(double(y) - want) / std::max(1.0, std::fabs(double(want)));
      worst = std::max(worst, rel);
    }
    __atomic_store_n(&box->in, -1, __ATOMIC_RELEASE);
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaStreamDestroy(stream));
    std::sort(took.begin(), took.end());
    auto at = [&](double q) { return took[std::min(took.size() - 1, size_t(q * took.size()))]; };
    std::printf("{\"case\": \"%s\", \"device\": \"%s\", \"ticks\": %zu, \"p50_us\": %.2f, "
                "\"p99_us\": %.2f, \"p999_us\": %.2f, \"max_us\": %.2f, "
                "\"max_relative_error\": %.2e}\n",
                names[mode], prop.name, took.size(), at(0.5), at(0.99), at(0.999), took.back(),
                worst);
    std::fflush(stdout);
  }
  return 0;
}
