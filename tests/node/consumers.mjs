// nats.js (v3) consumer paths used by tests/test_consumers_node.py.
//
// usage: node consumers.mjs <nats-url> <stream>
//
// Publishes 20 messages on <stream>.s0/.s1, then reads them through the main nats.js consumer
// paths and prints ONE JSON line with what each path saw:
//   next:    consumer.next() one at a time, acking, then next() on the empty consumer (null)
//   consume: consumer.consume() with a small max_messages, acking, until all arrived
//   fetch:   consumer.fetch() with a nak of the first message and its redelivery
//   ordered: an ordered consumer (js.consumers.get(stream)) filtered to .s1, via consume()
// On any error it prints {"error": "..."} and exits 1.

import { connect } from "@nats-io/transport-node";
import { AckPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";

const TIMEOUT_MS = Number(process.env.CONSUMERS_TIMEOUT_MS || 60_000);
let finished = false;

function emit(obj, code) {
  if (finished) return;
  finished = true;
  process.stdout.write(JSON.stringify(obj) + "\n", () => process.exit(code));
}

function fail(err) {
  const msg = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
  emit({ error: msg }, 1);
}

function seen(m) {
  return [m.subject, m.string(), m.seq, m.info.deliveryCount, m.info.pending];
}

async function state(jsm, stream, name) {
  const ci = await jsm.consumers.info(stream, name);
  return {
    delivered: ci.delivered.stream_seq,
    ack_floor: ci.ack_floor.stream_seq,
    num_ack_pending: ci.num_ack_pending,
    num_pending: ci.num_pending,
  };
}

async function settle(jsm, stream, name, pending = 0) {
  const by = Date.now() + 5000;
  let s = await state(jsm, stream, name);
  while (s.num_ack_pending > pending && Date.now() < by) {
    await new Promise((r) => setTimeout(r, 50));
    s = await state(jsm, stream, name);
  }
  return s;
}

async function main() {
  const [url, stream] = process.argv.slice(2);
  const prefix = stream.toLowerCase();
  const nc = await connect({ servers: url, name: "jetlake-consumers", reconnect: false });
  try {
    const jsm = await jetstreamManager(nc);
    const js = jetstream(nc);
    await jsm.streams.add({ name: stream, subjects: [`${prefix}.>`] });
    for (let i = 0; i < 20; i++) {
      await js.publish(`${prefix}.s${i % 2}`, `m${i}`);
    }
    const out = {};

    // next()
    await jsm.consumers.add(stream, { durable_name: "nx", ack_policy: AckPolicy.Explicit });
    const nx = await js.consumers.get(stream, "nx");
    out.next = [];
    for (let i = 0; i < 5; i++) {
      const m = await nx.next({ expires: 2000 });
      out.next.push(seen(m));
      await m.ackAck();
    }
    await jsm.consumers.add(stream, {
      durable_name: "nxe", ack_policy: AckPolicy.Explicit, filter_subject: `${prefix}.none`,
    });
    const empty = await (await js.consumers.get(stream, "nxe")).next({ expires: 1000 });
    out.next_empty = empty === null;
    out.next_state = await settle(jsm, stream, "nx");

    // consume()
    await jsm.consumers.add(stream, { durable_name: "cs", ack_policy: AckPolicy.Explicit });
    const cs = await js.consumers.get(stream, "cs");
    const iter = await cs.consume({ max_messages: 7, expires: 2000 });
    out.consume = [];
    for await (const m of iter) {
      out.consume.push(seen(m));
      m.ack();
      if (out.consume.length === 20) break;
    }
    await nc.flush();
    out.consume_state = await settle(jsm, stream, "cs");

    // fetch() with a nak and its redelivery
    await jsm.consumers.add(stream, {
      durable_name: "ft", ack_policy: AckPolicy.Explicit, filter_subject: `${prefix}.s0`,
    });
    const ft = await js.consumers.get(stream, "ft");
    out.fetch = [];
    let first = true;
    while (out.fetch.length < 11) {
      const batch = await ft.fetch({ max_messages: 4, expires: 2000 });
      const got = [];
      for await (const m of batch) got.push(m);
      // The nak and acks go once the whole batch is in: a nak that reached the real server while
      // it was still sending the batch (one message at a time) would put the redelivery into
      // that same batch, a race neither server controls.
      for (const m of got) {
        out.fetch.push(seen(m));
        if (first) {
          first = false;
          m.nak();
        } else {
          m.ack();
        }
      }
      // The next fetch goes once the nak and the acks behind it have been taken (only the nak'd
      // message is pending): both servers take acks and pull requests on separate paths. Then
      // the redelivery leads the next batch, as the server's redelivery queue comes first.
      if (out.fetch.length === 4) await settle(jsm, stream, "ft", 1);
    }
    await nc.flush();
    out.fetch_state = await settle(jsm, stream, "ft");

    // ordered consumer
    const oc = await js.consumers.get(stream, { filter_subjects: [`${prefix}.s1`] });
    const oiter = await oc.consume({ max_messages: 3 });
    out.ordered = [];
    for await (const m of oiter) {
      out.ordered.push([m.subject, m.string(), m.seq]);
      if (out.ordered.length === 10) break;
    }
    await nc.close();
    emit(out, 0);
  } finally {
    if (!nc.isClosed()) await nc.close().catch(() => {});
  }
}

const deadline = setTimeout(() => fail(new Error(`timed out after ${TIMEOUT_MS}ms`)), TIMEOUT_MS);
main().then(() => clearTimeout(deadline), fail);
