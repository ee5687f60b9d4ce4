// The official `openai` Node client, unchanged, against `edge serve`: runs the cases it is
// given and prints what each produced, one JSON line per case.
//
// Usage: EDGE_NODE_OPENAI=<the installed package's directory> node openai_node.cjs < cases.json
// Input: {"baseURL", "apiKey", "concurrent": bool, "cases": [{"name", "kind": "completions" |
//   "chat", "params", "stream": bool, "apiKey"?, "maxRetries"?, "announce"?: bool}]}.
// Output: per case {"name", "ok", "chunks", "choices": {index: {"text", "finish",
//   "logprobs": [[token, logprob], ...]}}, "usage", "error": {"class", "status", "param",
//   "code", "type", "message"} | null}; with "concurrent" it first prints {"started": true}
//   as the requests go out, and a case with "announce" prints {"name", "first": true} when
//   its first chunk arrives (the caller may then cut it).
"use strict";

const fs = require("fs");
const OpenAI = require(process.env.EDGE_NODE_OPENAI);

function emit(line) {
  process.stdout.write(JSON.stringify(line) + "\n");
}

function describe(error) {
  return {
    class: error && error.constructor ? error.constructor.name : typeof error,
    status: error && error.status !== undefined ? error.status : null,
    param: error && error.param !== undefined ? error.param : null,
    code: error && error.code !== undefined ? error.code : null,
    type: error && error.type !== undefined ? error.type : null,
    message: String(error && error.message),
  };
}

function absorb(result, answer, chat, streamed) {
  for (const choice of answer.choices || []) {
    const entry = (result.choices[choice.index] =
      result.choices[choice.index] || { text: "", finish: null, logprobs: [] });
    if (chat) {
      const part = streamed ? choice.delta : choice.message;
      entry.text += (part && part.content) || "";
      for (const item of (choice.logprobs && choice.logprobs.content) || []) {
        entry.logprobs.push([item.token, item.logprob]);
      }
    } else {
      entry.text += choice.text || "";
      const lp = choice.logprobs;
      if (lp && lp.tokens) {
        lp.tokens.forEach((token, i) => entry.logprobs.push([token, lp.token_logprobs[i]]));
      }
    }
    if (choice.finish_reason) entry.finish = choice.finish_reason;
  }
  if (answer.usage) result.usage = answer.usage;
}

async function run(input, spec) {
  const client = new OpenAI({
    baseURL: input.baseURL,
    apiKey: spec.apiKey || input.apiKey,
    maxRetries: spec.maxRetries === undefined ? 2 : spec.maxRetries,
    timeout: 600000,
  });
  const api = spec.kind === "chat" ? client.chat.completions : client.completions;
  const chat = spec.kind === "chat";
  const result = { name: spec.name, ok: false, chunks: 0, choices: {}, usage: null, error: null };
  try {
    if (spec.stream) {
      const stream = await api.create({ ...spec.params, stream: true });
      for await (const chunk of stream) {
        result.chunks += 1;
        if (result.chunks === 1 && spec.announce) emit({ name: spec.name, first: true });
        absorb(result, chunk, chat, true);
      }
    } else {
      absorb(result, await api.create(spec.params), chat, false);
    }
    result.ok = true;
  } catch (error) {
    result.error = describe(error);
  }
  return result;
}

async function main() {
  const input = JSON.parse(fs.readFileSync(0, "utf8"));
  if (input.concurrent) {
    emit({ started: true }); // the client is loaded: the requests go out now
    await Promise.all(input.cases.map(async (spec) => emit(await run(input, spec))));
  } else {
    for (const spec of input.cases) emit(await run(input, spec));
  }
}

main().catch((error) => {
  emit({ name: "<harness>", ok: false, error: describe(error) });
  process.exitCode = 1;
});
