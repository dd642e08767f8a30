// Load generator for bench/run.py: nats.js is fast enough that the server, not the client, is measured
// (a nats-py publisher tops out well below what nats-server takes).
//
// usage: node loadgen.mjs <mode> <nats-url> <subject-prefix> <count> <payload> [window]
//   mode     sync      js.publish one at a time, awaiting each PubAck: latency percentiles
//            pipelined js.publish with <window> PubAcks outstanding: acked messages per second
//            core      plain publishes as fast as the connection takes them, then flush: the caller
//                      counts what the stream stored
//            pull      a durable pull consumer on stream <subject-prefix>: fetch batches of <window>,
//                      ack every message; <count> messages, timed until the ack floor reaches them
//            push      a push consumer delivering to an inbox, <window> acks pending at most, ack every
//                      message; timed the same way
//   payload  json (realistic JSON documents of ~200 bytes), random128 (incompressible bytes) or seq
//            ("payload-<n>", what bench/stored.py writes straight into a Delta table); the
//            consumer modes ignore it
// Prints ONE JSON line with the figures; on error {"error": "..."} and exit code 1.

import { randomBytes } from "node:crypto";
import { connect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";

const [mode, url, prefix, countArg, payloadKind, windowArg] = process.argv.slice(2);
const count = Number(countArg);
const window = Number(windowArg || 256);
const enc = new TextEncoder();

const REGIONS = ["eu-west", "eu-central", "us-east", "us-west", "ap-south", "ap-northeast"];
const STATUSES = ["created", "paid", "packed", "shipped", "delivered", "returned"];
const SKUS = ["SKU-10442", "SKU-20931", "SKU-33810", "SKU-41207", "SKU-58812", "SKU-60021", "SKU-77713"];

// A deterministic pseudo-random stream so both servers get the same payloads.
let seed = 0x2545f491;
function rnd(n) {
  seed ^= seed << 13;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  return (seed >>> 0) % n;
}

function jsonPayload(i) {
  const doc = {
    order_id: 1_000_000 + i,
    customer: `cust-${String(rnd(50_000)).padStart(6, "0")}`,
    region: REGIONS[rnd(REGIONS.length)],
    status: STATUSES[rnd(STATUSES.length)],
    items: [{ sku: SKUS[rnd(SKUS.length)], qty: 1 + rnd(5) }],
    amount: Number((rnd(100_000) / 100).toFixed(2)),
    currency: "EUR",
    trace_id: randomBytes(8).toString("hex"),
    ts: new Date(1_780_000_000_000 + i * 7).toISOString(),
  };
  return enc.encode(JSON.stringify(doc));
}

function payloadFor(i) {
  if (payloadKind === "seq") return enc.encode(`payload-${i + 1}`); // what bench/stored.py writes
  return payloadKind === "random128" ? randomBytes(128) : jsonPayload(i);
}

function subjectFor(i) {
  return `${prefix}.${REGIONS[i % REGIONS.length]}`;
}

function percentile(sorted, p) {
  if (!sorted.length) return null;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

async function runSync(js) {
  const lat = new Float64Array(count);
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < count; i++) {
    const s = process.hrtime.bigint();
    await js.publish(subjectFor(i), payloadFor(i));
    lat[i] = Number(process.hrtime.bigint() - s) / 1e6;
  }
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  const sorted = Array.from(lat).sort((a, b) => a - b);
  return {
    messages: count,
    seconds: secs,
    p50_ms: percentile(sorted, 50),
    p90_ms: percentile(sorted, 90),
    p99_ms: percentile(sorted, 99),
    max_ms: sorted[sorted.length - 1],
  };
}

async function runPipelined(js) {
  // Every payload distinct (bytes on disk are measured with this mode): repeated payloads would
  // flatter any compressor.
  let next = 0;
  let acked = 0;
  let failed = 0;
  const t0 = process.hrtime.bigint();
  async function lane() {
    while (next < count) {
      const i = next++;
      try {
        await js.publish(subjectFor(i), payloadFor(i), { timeout: 30_000 });
        acked++;
      } catch {
        failed++;
      }
    }
  }
  await Promise.all(Array.from({ length: window }, lane));
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  return { messages: count, acked, failed, seconds: secs, acked_per_s: acked / secs };
}

async function runCore(nc) {
  const payloads = Array.from({ length: Math.min(count, 4096) }, (_, i) => payloadFor(i));
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < count; i++) {
    nc.publish(subjectFor(i), payloads[i % payloads.length]);
    // Yield now and then so the socket drains instead of buffering everything in the client.
    if ((i & 0x3fff) === 0x3fff) await new Promise((r) => setImmediate(r));
  }
  await nc.flush();
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  return { messages: count, seconds: secs, sent_per_s: count / secs, t0_ms: Date.now() - secs * 1000 };
}

// Both consumer modes start at the stream's first message and stop after <count>; the clock stops when
// the server's ack floor has reached the last one, so unprocessed acks are not counted as done.
async function consumed(nc, name, start, received, lastSeq) {
  const jsm = await jetstreamManager(nc);
  await nc.flush();
  for (;;) {
    const info = await jsm.consumers.info(prefix, name);
    if (info.ack_floor.stream_seq >= lastSeq) break;
    await new Promise((r) => setTimeout(r, 5));
  }
  const secs = Number(process.hrtime.bigint() - start) / 1e9;
  await jsm.consumers.delete(prefix, name);
  return { messages: received, seconds: secs, consumed_per_s: received / secs };
}

async function runPull(nc, js) {
  const jsm = await jetstreamManager(nc);
  const name = `bpull${Date.now()}`;
  await jsm.consumers.add(prefix, { durable_name: name, ack_policy: "explicit", max_ack_pending: -1 });
  const consumer = await js.consumers.get(prefix, name);
  let received = 0;
  let lastSeq = 0;
  const start = process.hrtime.bigint();
  while (received < count) {
    const batch = await consumer.fetch({ max_messages: Math.min(window, count - received), expires: 10_000 });
    for await (const m of batch) {
      m.ack();
      lastSeq = m.seq;
      received++;
    }
  }
  return consumed(nc, name, start, received, lastSeq);
}

async function runPush(nc) {
  const jsm = await jetstreamManager(nc);
  const name = `bpush${Date.now()}`;
  const inbox = `_INBOX.bench.${name}`;
  let received = 0;
  let lastSeq = 0;
  let done;
  const finished = new Promise((r) => (done = r));
  // Acks are plain publishes to the reply subject: the same bytes any JetStream client sends.
  const sub = nc.subscribe(inbox, {
    callback: (_err, m) => {
      if (!m.reply) return; // no flow control or heartbeats are asked for; anything else is ignored
      nc.publish(m.reply, "+ACK");
      const tokens = m.reply.split(".");
      lastSeq = Number(tokens[tokens.length === 9 ? 5 : 7]); // $JS.ACK v1 and v2 (domain, hash) forms
      if (++received === count) done();
    },
  });
  await nc.flush();
  const start = process.hrtime.bigint();
  await jsm.consumers.add(prefix, {
    durable_name: name,
    deliver_subject: inbox,
    ack_policy: "explicit",
    max_ack_pending: window,
  });
  await finished;
  sub.unsubscribe();
  return consumed(nc, name, start, received, lastSeq);
}

async function main() {
  const nc = await connect({ servers: url, name: `jetlake-bench-${mode}`, reconnect: false });
  try {
    const js = jetstream(nc, { timeout: 30_000 });
    let out;
    if (mode === "sync") out = await runSync(js);
    else if (mode === "pipelined") out = await runPipelined(js);
    else if (mode === "core") out = await runCore(nc);
    else if (mode === "pull") out = await runPull(nc, js);
    else if (mode === "push") out = await runPush(nc);
    else throw new Error(`unknown mode ${mode}`);
    process.stdout.write(JSON.stringify(out) + "\n");
  } finally {
    await nc.close();
  }
}

main().catch((err) => {
  process.stdout.write(JSON.stringify({ error: String(err?.message ?? err) }) + "\n");
  process.exit(1);
});
