// Thin-slice nats.js (v3) driver used by tests/test_node_client.py.
//
// usage: node thin_slice.mjs <nats-url> <stream> <subject-prefix> <count>
//
// Adds stream <stream> with subjects [<prefix>.>], publishes <count> messages
// (subject <prefix>.<i % 3>, payload "msg-<i>", header X-Idx: <i>) with
// js.publish, creates durable pull consumer "njs" (explicit ack), drains it
// with consumer.fetch() loops acking every message, then prints ONE JSON line:
//   {"pubacks": [...], "received": [...], "stream_state": {...}, "consumer": {...}, "fetches": [...]}
// On any error it prints {"error": "..."} and exits 1.
// The overall deadline is THIN_SLICE_TIMEOUT_MS (default 60000).

import { connect, headers } from "@nats-io/transport-node";
import { AckPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";

const CONSUMER = "njs";
const TIMEOUT_MS = Number(process.env.THIN_SLICE_TIMEOUT_MS || 60_000);

let finished = false;

function emit(obj, code) {
  if (finished) return;
  finished = true;
  process.stdout.write(JSON.stringify(obj) + "\n", () => process.exit(code));
}

function fail(err) {
  const msg = err instanceof Error
    ? `${err.name}: ${err.message}${err.cause ? ` (cause: ${err.cause?.message ?? err.cause})` : ""}`
    : String(err);
  emit({ error: msg }, 1);
}

// Reply subjects are either the v1 form
//   $JS.ACK.<stream>.<consumer>.<dcount>.<sseq>.<dseq>.<ts>.<pending>          (9 tokens)
// or the v2 form
//   $JS.ACK.<domain>.<acchash>.<stream>.<consumer>.<dcount>.<sseq>.<dseq>.<ts>.<pending>[.<rand>]
// The prefix is everything before <dcount> (no per-message values, so it is comparable).
function replyPrefix(reply) {
  if (typeof reply !== "string" || reply === "") return null;
  const t = reply.split(".");
  if (t[0] !== "$JS" || t[1] !== "ACK") return reply;
  return t.slice(0, t.length === 9 ? 4 : 6).join(".");
}

function seqPair(sp) {
  return sp ? { consumer_seq: sp.consumer_seq, stream_seq: sp.stream_seq } : null;
}

async function main() {
  const [url, stream, prefix, countArg] = process.argv.slice(2);
  const count = Number.parseInt(countArg, 10);
  if (!url || !stream || !prefix || !Number.isInteger(count) || count < 0) {
    throw new Error("usage: node thin_slice.mjs <nats-url> <stream> <subject-prefix> <count>");
  }

  const nc = await connect({ servers: url, name: "jetlake-thin-slice", reconnect: false });
  try {
    const jsm = await jetstreamManager(nc);
    const js = jetstream(nc);

    await jsm.streams.add({ name: stream, subjects: [`${prefix}.>`] });

    const pubacks = [];
    for (let i = 0; i < count; i++) {
      const h = headers();
      h.set("X-Idx", String(i));
      const pa = await js.publish(`${prefix}.${i % 3}`, `msg-${i}`, { headers: h });
      pubacks.push({ stream: pa.stream, seq: pa.seq, duplicate: pa.duplicate });
    }

    await jsm.consumers.add(stream, { durable_name: CONSUMER, ack_policy: AckPolicy.Explicit });
    const consumer = await js.consumers.get(stream, CONSUMER);

    const received = [];
    const fetches = [];
    while (received.length < count) {
      const iter = await consumer.fetch({ max_messages: 100, expires: 2000 });
      const events = {};
      const statusIter = iter.status();
      (async () => {
        for await (const s of statusIter) {
          const key = s.code ? `${s.type}:${s.code}` : s.type;
          events[key] = (events[key] || 0) + 1;
        }
      })().catch(() => {});
      const started = Date.now();
      let got = 0;
      for await (const m of iter) {
        got++;
        received.push({
          subject: m.subject,
          data: m.string(),
          x_idx: m.headers?.get("X-Idx") ?? null,
          seq: m.seq,
          delivery_seq: m.info.deliverySequence,
          delivery_count: m.info.deliveryCount,
          redelivered: m.redelivered,
          pending: m.info.pending,
          info_stream: m.info.stream,
          info_consumer: m.info.consumer,
          reply_prefix: replyPrefix(m.reply),
        });
        m.ack();
      }
      fetches.push({ received: got, ms: Date.now() - started, events });
      if (fetches.length > 50) {
        throw new Error(`gave up after ${fetches.length} fetches with ${received.length}/${count} messages`);
      }
    }

    // m.ack() is a fire-and-forget publish: flush so the server has them, then give the
    // consumer a moment to process them (the server handles acks asynchronously).
    await nc.flush();
    let ci = await jsm.consumers.info(stream, CONSUMER);
    let ackPolls = 1;
    const settleBy = Date.now() + 5000;
    while (ci.num_ack_pending > 0 && Date.now() < settleBy) {
      await new Promise((r) => setTimeout(r, 50));
      ci = await jsm.consumers.info(stream, CONSUMER);
      ackPolls++;
    }

    const si = await jsm.streams.info(stream);
    const out = {
      pubacks,
      received,
      stream_state: {
        messages: si.state.messages,
        first_seq: si.state.first_seq,
        last_seq: si.state.last_seq,
        consumer_count: si.state.consumer_count,
      },
      consumer: {
        delivered: seqPair(ci.delivered),
        ack_floor: seqPair(ci.ack_floor),
        num_ack_pending: ci.num_ack_pending,
        num_pending: ci.num_pending,
        num_redelivered: ci.num_redelivered,
        num_waiting: ci.num_waiting,
        ack_polls: ackPolls,
      },
      fetches,
    };
    await nc.close();
    emit(out, 0);
  } finally {
    if (!nc.isClosed()) await nc.close().catch(() => {});
  }
}

const deadline = setTimeout(() => fail(new Error(`timed out after ${TIMEOUT_MS}ms`)), TIMEOUT_MS);
main().then(() => clearTimeout(deadline), fail);
