#!/usr/bin/env python3
"""Monte Carlo answers against a reference computed here: the same model in onnxruntime,
the same sigma, numpy's own noise.

    python crates/tickserve-server/tests/python/monte_carlo_check.py --http 127.0.0.1:8000 \
        --grpc 127.0.0.1:8001

For alpha_mlp and seq_lstm (sample models), three rows and five seeds, 4096 samples each
(one row per request):
the server's mean and standard deviation per output element agree with the reference's
within 5 standard errors of their difference. Both are estimates from N = 4096 samples:
the difference of two independent means has a standard error of sqrt(2) * s / sqrt(N),
the difference of two standard deviations about s / sqrt(N) (s the reference's standard
deviation; a normal-theory approximation). At 5 standard errors a false alarm is a
one-in-a-million event per element. Also: one seed twice gives identical answers.
Started by crates/tickserve-server/tests/server/features/monte_carlo.rs; prints `done`.
"""
import argparse
import json
import pathlib
import sys
import urllib.request

import numpy as np
from reference import check  # noqa: E402 (beside this script)
import onnxruntime as ort

ROOT = pathlib.Path(__file__).resolve().parents[4]
N = 4096
SIGMA = 0.05
SEEDS = [1, 2, 3, 4, 5]
ROWS = 3
Z = 5.0
MODELS = ["alpha_mlp", "seq_lstm"]



def infer(http, model, body):
    request = urllib.request.Request(f"http://{http}/v2/models/{model}/infer",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return {o["name"]: np.array(o["data"], np.float64).reshape(o["shape"])
                for o in json.loads(response.read())["outputs"]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--http", required=True)
    p.add_argument("--grpc")
    args = p.parse_args()
    rng = np.random.default_rng(2026)
    worst = 0.0
    for model in MODELS:
        session = ort.InferenceSession(str(ROOT / f"config/models/{model}/1/model.onnx"))
        input_name = session.get_inputs()[0].name
        output_name = session.get_outputs()[0].name
        shape = [ROWS] + list(session.get_inputs()[0].shape[1:])
        x = rng.standard_normal(shape).astype(np.float32)
        for seed in SEEDS:
            for row in range(ROWS):
                # One row per request: 4096 samples is the default max_samples.
                body = {"parameters": {"mc_samples": N, "mc_noise_sigma": SIGMA, "mc_seed": seed},
                        "inputs": [{"name": input_name, "datatype": "FP32",
                                    "shape": [1] + list(x.shape[1:]),
                                    "data": x[row].ravel().tolist()}]}
                answer = infer(args.http, model, body)
                if seed == SEEDS[0] and row == 0:
                    again = infer(args.http, model, body)
                    check(all(np.array_equal(answer[k], again[k]) for k in answer),
                          f"{model}: seed {seed} twice gave different answers")
                got_mean = answer[f"{output_name}_mean"][0]
                got_std = answer[f"{output_name}_std"][0]
                noisy = x[row] + SIGMA * rng.standard_normal((N,) + x.shape[1:])
                out = session.run(None, {input_name: noisy.astype(np.float32)})[0].astype(np.float64)
                mean, std = out.mean(axis=0), out.std(axis=0)
                mean_bound = Z * np.sqrt(2) * std / np.sqrt(N) + 1e-6
                std_bound = Z * std / np.sqrt(N) + 1e-6
                d_mean = np.abs(got_mean - mean) / mean_bound
                d_std = np.abs(got_std - std) / std_bound
                worst = max(worst, float(d_mean.max()), float(d_std.max()))
                check(np.all(d_mean <= 1), f"{model} seed {seed} row {row}: mean {got_mean} "
                      f"vs reference {mean} (bound {mean_bound})")
                check(np.all(d_std <= 1), f"{model} seed {seed} row {row}: std {got_std} "
                      f"vs reference {std} (bound {std_bound})")
    print(f"mean and std of {N} samples agree with the numpy/onnxruntime reference for "
          f"{len(MODELS)} models x 3 rows x {len(SEEDS)} seeds; the worst difference is "
          f"{worst:.2f} of its {Z:.0f}-standard-error bound")
    print("done")


if __name__ == "__main__":
    main()
