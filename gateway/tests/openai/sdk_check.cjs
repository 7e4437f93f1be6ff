// The official `openai` npm package, unchanged, against a gateway (driven by openai_sdk.rs):
// create, stream, background then retrieve, resume after a cursor (on another gateway when
// MRT_SECOND_BASE_URL is set), cancel. Environment as sdk_check.py: OPENAI_BASE_URL, MRT_KEY,
// MRT_SECOND_BASE_URL (optional). Prints `ok <case>` per passing case; exits 1 at a failure.
'use strict';

const { OpenAI } = require('openai');

const base = process.env.OPENAI_BASE_URL;
const client = new OpenAI({ baseURL: base, apiKey: process.env.MRT_KEY, maxRetries: 0 });
const elsewhere = new OpenAI({
  baseURL: process.env.MRT_SECOND_BASE_URL || base,
  apiKey: process.env.MRT_KEY,
  maxRetries: 0,
});
const TEXT = 'hello from mock';

function check(condition, what) {
  if (!condition) throw new Error(what);
}

async function collect(stream) {
  const events = [];
  for await (const event of stream) events.push(event);
  return events;
}

const cases = {
  async create() {
    const r = await client.responses.create({ model: 'model-alpha', input: 'hi' });
    check(r.status === 'completed', `status ${r.status}`);
    check(r.output_text === TEXT, `text ${r.output_text}`);
    check(r.usage.total_tokens === 4, `usage ${JSON.stringify(r.usage)}`);
  },

  async stream() {
    const events = await collect(
      await client.responses.create({ model: 'model-alpha', input: 'hi', stream: true }),
    );
    events.forEach((e, n) => check(e.sequence_number === n, `number ${e.sequence_number} at ${n}`));
    check(events[events.length - 1].type === 'response.completed', 'completed last');
    const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta);
    check(text.join('') === TEXT, `deltas ${text.join('')}`);
  },

  async background() {
    let r = await client.responses.create({ model: 'model-slow', input: 'hi', background: true });
    check(r.status === 'queued' || r.status === 'in_progress', `status ${r.status}`);
    const deadline = Date.now() + 60000;
    while (r.status === 'queued' || r.status === 'in_progress') {
      check(Date.now() < deadline, 'background response never finished');
      await new Promise((resolve) => setTimeout(resolve, 100));
      r = await client.responses.retrieve(r.id);
    }
    check(r.status === 'completed', `status ${r.status}`);
    check(r.output_text === 's '.repeat(10), `text ${r.output_text}`);
  },

  async resume() {
    const stream = await client.responses.create({ model: 'model-slow', input: 'hi', stream: true });
    const seen = [];
    for await (const event of stream) {
      seen.push(event);
      if (event.type === 'response.output_text.delta') break; // the connection is dropped
    }
    const id = seen[0].response.id;
    const after = seen[seen.length - 1].sequence_number;
    const resumed = await collect(
      await elsewhere.responses.retrieve(id, { stream: true, starting_after: after }),
    );
    resumed.forEach((e, n) => check(e.sequence_number === after + 1 + n, `resumed ${e.sequence_number}`));
    check(resumed[resumed.length - 1].type === 'response.completed', 'completed last');
    const whole = await collect(await client.responses.retrieve(id, { stream: true }));
    check(
      JSON.stringify(whole.slice(after + 1)) === JSON.stringify(resumed),
      'the events after the cursor, exactly',
    );
  },

  async cancel() {
    const r = await client.responses.create({ model: 'model-stuck', input: 'hi', background: true });
    const cancelled = await client.responses.cancel(r.id);
    check(cancelled.status === 'cancelled', `status ${cancelled.status}`);
  },
};

(async () => {
  for (const [name, run] of Object.entries(cases)) {
    try {
      await run();
    } catch (e) {
      console.log(`FAILED ${name}: ${e && e.stack ? e.stack : e}`);
      process.exit(1);
    }
    console.log(`ok ${name}`);
  }
})();
