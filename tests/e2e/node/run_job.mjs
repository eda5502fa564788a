#!/usr/bin/env node
// Drives one rollway run through the coordinator's gRPC API, as a Node.js system would:
//
//   StartRun(config as google.protobuf.Struct) -> StreamMetrics (to the run's end)
//     -> GetRun polled until a final state -> one JSON summary on stdout
//
// With --stop-after-first-metric it calls StopRun(immediate=true) as soon as the first metrics
// record arrives. The protos are loaded at run time from the repository's protos/ folder with
// @grpc/proto-loader: no generated code. Client-side failures (an RPC error, a deadline) print
// the error on stderr and exit 2; a run that ends FAILED or STOPPED is still a summary (exit 0).
//
//   node run_job.mjs --address 127.0.0.1:PORT --config run.json [--run-id ID]
//                    [--stop-after-first-metric] [--timeout-s 300]

import { readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

const HERE = dirname(fileURLToPath(import.meta.url));
const FINAL_STATES = new Set(["RUN_STATE_SUCCEEDED", "RUN_STATE_FAILED", "RUN_STATE_STOPPED"]);

const { values: args } = parseArgs({
  options: {
    address: { type: "string" },
    config: { type: "string" },
    "run-id": { type: "string", default: "" },
    protos: { type: "string", default: resolve(HERE, "../../../protos") },
    "stop-after-first-metric": { type: "boolean", default: false },
    "timeout-s": { type: "string", default: "300" },
  },
});
if (!args.address || !args.config) {
  console.error("usage: run_job.mjs --address HOST:PORT --config RUN.json [--run-id ID] [--stop-after-first-metric]");
  process.exit(2);
}
const deadlineMs = Date.now() + Number(args["timeout-s"]) * 1000;

// A JSON value as a google.protobuf.Value (proto-loader has no JSON mapping for Struct; its fields
// are camelCase, as are all field names here: runId, numSteps, serviceAddresses).
function toValue(v) {
  if (v === null) return { nullValue: "NULL_VALUE" };
  if (Array.isArray(v)) return { listValue: { values: v.map(toValue) } };
  switch (typeof v) {
    case "number": return { numberValue: v };
    case "string": return { stringValue: v };
    case "boolean": return { boolValue: v };
    case "object": return { structValue: toStruct(v) };
    default: throw new TypeError(`config value ${String(v)} is not JSON`);
  }
}
function toStruct(obj) {
  return { fields: Object.fromEntries(Object.entries(obj).map(([k, v]) => [k, toValue(v)])) };
}

function loadCoordinator(protosDir) {
  const definition = protoLoader.loadSync("rollway/coordinator/v1/coordinator.proto", {
    includeDirs: [protosDir],
    longs: Number,
    enums: String,
    defaults: true,
  });
  const { CoordinatorService } = grpc.loadPackageDefinition(definition).rollway.coordinator.v1;
  return new CoordinatorService(args.address, grpc.credentials.createInsecure());
}

const call = (client, method, request) =>
  new Promise((ok, fail) =>
    client[method](request, { deadline: new Date(deadlineMs) }, (err, reply) => (err ? fail(err) : ok(reply))),
  );

// Every metrics record of the run, from step 0 to the run's end; `onRecord` sees each as it arrives.
function streamMetrics(client, runId, onRecord) {
  return new Promise((ok, fail) => {
    const records = [];
    const stream = client.StreamMetrics({ runId, fromStep: 0 }, { deadline: new Date(deadlineMs) });
    stream.on("data", (r) => {
      records.push({ step: r.step, time: r.time, metrics: r.metrics });
      onRecord(r);
    });
    stream.on("error", fail);
    stream.on("end", () => ok(records));
  });
}

async function waitFinal(client, runId) {
  for (let pause = 50; ; pause = Math.min(pause * 2, 1000)) {
    const { run } = await call(client, "GetRun", { runId });
    if (FINAL_STATES.has(run.state)) return run;
    if (Date.now() + pause > deadlineMs) throw new Error(`run ${runId} still ${run.state} at the deadline`);
    await new Promise((r) => setTimeout(r, pause));
  }
}

async function main() {
  const client = loadCoordinator(args.protos);
  const config = JSON.parse(readFileSync(args.config, "utf8"));
  const started = Date.now();
  const { run: startedRun } = await call(client, "StartRun", { config: toStruct(config), runId: args["run-id"] });
  const runId = startedRun.runId;

  let stop = null; // what the stop mode saw: when it asked, what StopRun said, how long the stop took
  let stopReply = null;
  const records = await streamMetrics(client, runId, (record) => {
    if (!args["stop-after-first-metric"] || stop) return;
    stop = { requested_at_step: record.step, requested_s: (Date.now() - started) / 1000 };
    stopReply = call(client, "StopRun", { runId, immediate: true }).then(
      (reply) => reply.run.state,
      (err) => `StopRun failed: ${grpc.status[err.code]}: ${err.details}`,
    );
  });
  if (stop) stop.reply_state = await stopReply;
  const run = await waitFinal(client, runId);
  if (stop) stop.final_after_s = (Date.now() - started) / 1000 - stop.requested_s; // StopRun -> final state
  client.close();

  const series = (name) => records.filter((r) => name in r.metrics).map((r) => ({ step: r.step, value: r.metrics[name] }));
  const summary = {
    run_id: runId,
    state: run.state,
    step: run.step,
    num_steps: run.numSteps,
    error: run.error,
    run_dir: run.runDir,
    checkpoint_dir: run.checkpointDir,
    hf_export_dir: run.hfExportDir,
    service_addresses: run.serviceAddresses,
    last_metrics: run.lastMetrics,
    started_state: startedRun.state,
    steps: records.map((r) => r.step),
    losses: Object.fromEntries(
      ["sft/loss", "train/pg_loss", "train/loss"].map((k) => [k, series(k)]).filter(([, s]) => s.length),
    ),
    rewards: Object.fromEntries(
      ["rollout/raw_reward", "rollout/rewards"].map((k) => [k, series(k)]).filter(([, s]) => s.length),
    ),
    metric_names: [...new Set(records.flatMap((r) => Object.keys(r.metrics)))].sort(),
    stop,
    elapsed_s: (Date.now() - started) / 1000,
  };
  process.stdout.write(JSON.stringify(summary) + "\n");
}

main().catch((err) => {
  console.error(`run_job.mjs: ${err.code !== undefined ? `gRPC ${grpc.status[err.code]}: ${err.details}` : err.stack}`);
  process.exit(2);
});
