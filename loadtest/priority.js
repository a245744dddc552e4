// Background traffic at one priority level: ROWS-row seq_lstm requests over HTTP (binary
// tensors) with
// the request parameter `priority` = PRIORITY, in the load shape SCENARIO (lib/scenarios.js),
// counting what was answered and what was shed (429). scripts/bench/bench_priorities.sh runs it
// at level 2 while perf_analyzer measures level 1.
//
//   .venv/bin/k6 run -e SCENARIO=steady -e RATE=400 -e PRIORITY=2 loadtest/priority.js
//
// Env: TICKSERVE_HTTP (http://127.0.0.1:8000), MODEL (seq_lstm), ROWS (64), PRIORITY (2)
// and those of lib/scenarios.js.
import http from 'k6/http';
import { Counter, Trend } from 'k6/metrics';
import * as shape from './lib/scenarios.js';

const BASE = __ENV.TICKSERVE_HTTP || 'http://127.0.0.1:8000';
const MODEL = __ENV.MODEL || 'seq_lstm';
const ROWS = parseInt(__ENV.ROWS || '64', 10);
const PRIORITY = parseInt(__ENV.PRIORITY || '2', 10);
const answered = new Trend('answered_duration', true);
const answeredCount = new Counter('answered');
const shedCount = new Counter('shed');
const failedCount = new Counter('failed');
export const options = shape.options('answered_duration', 'failed');

// Binary tensors (Triton's extension): the JSON header, then the rows' bytes, so that
// decoding stays cheap and the server's CPU goes to the model.
const header = JSON.stringify({
  parameters: { priority: PRIORITY },
  inputs: [{
    name: 'window', datatype: 'FP32', shape: [ROWS, 30, 8],
    parameters: { binary_data_size: ROWS * 30 * 8 * 4 },
  }],
});
const headerBytes = new Uint8Array(header.length);
for (let i = 0; i < header.length; i++) headerBytes[i] = header.charCodeAt(i);
const values = new Float32Array(ROWS * 30 * 8).map((_, i) => (i % 13) / 13);
const body = new Uint8Array(headerBytes.length + values.byteLength);
body.set(headerBytes, 0);
body.set(new Uint8Array(values.buffer), headerBytes.length);
const params = {
  headers: { 'Content-Type': 'application/octet-stream', 'Inference-Header-Content-Length': `${headerBytes.length}` },
  responseCallback: http.expectedStatuses(200, 429),
};

export default function () {
  const r = http.post(`${BASE}/v2/models/${MODEL}/infer`, body.buffer, params);
  if (r.status === 200) {
    answered.add(r.timings.duration);
    answeredCount.add(1);
  } else if (r.status === 429) {
    shedCount.add(1);
  } else {
    failedCount.add(1);
  }
}
