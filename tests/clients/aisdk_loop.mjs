// The Vercel AI SDK's tool loop against a gateway, for tests/test_ai_sdk.py (issue 13.3).
//
//   node aisdk_loop.mjs '{"baseURL": "http://127.0.0.1:PORT/v1", "model": "...",
//                         "mode": "stream"|"generate", "transport": "http"|"ws",
//                         "store": null|false, "steps": 4, "maxOutputTokens": null,
//                         "temperature": null, "firstToolChoice": null}'
//
// createOpenAI({ baseURL, apiKey }).responses(model) with the provider's defaults untouched (store
// true, no previous_response_id): one tool, get_weather, executed here, and up to `steps` model
// calls. "ws" routes the SDK's streaming POSTs through @vercel/ai-sdk-openai-websocket-fetch (the
// released @ai-sdk/openai has no Responses WebSocket transport of its own; that shim is Vercel's
// drop-in fetch for it); the SDK itself is unchanged. "store": false adds
// providerOptions.openai.store = false. Prints one JSON line: steps (finish reason, tool calls and
// results, text, response id), the final text, and the error if the loop threw.
import { generateText, jsonSchema, stepCountIs, streamText, tool } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { createWebSocketFetch } from '@vercel/ai-sdk-openai-websocket-fetch';

const opts = JSON.parse(process.argv[2] ?? '{}');
const baseURL = opts.baseURL;
const wsFetch = opts.transport === 'ws'
  ? createWebSocketFetch({ url: baseURL.replace(/^http/, 'ws') + '/responses' })
  : undefined;
const openai = createOpenAI({ baseURL, apiKey: opts.apiKey ?? 'test-key', ...(wsFetch ? { fetch: wsFetch } : {}) });

const executed = [];
const tools = {
  get_weather: tool({
    description: 'The current weather of a city',
    inputSchema: jsonSchema({
      type: 'object',
      properties: { city: { type: 'string', description: 'City name' } },
      required: ['city'],
      additionalProperties: false,
    }),
    execute: async ({ city }) => {
      executed.push(city);
      return `sunny, 21C in ${city}`;
    },
  }),
};

const call = {
  model: openai.responses(opts.model),
  ...(opts.system ? { system: opts.system } : {}),
  prompt: opts.prompt ?? 'What is the weather in Oslo?',
  tools,
  stopWhen: stepCountIs(opts.steps ?? 4),
  maxRetries: 0,
  ...(opts.maxOutputTokens ? { maxOutputTokens: opts.maxOutputTokens } : {}),
  ...(opts.temperature != null ? { temperature: opts.temperature } : {}),
  // a small model may need telling to call the tool on the first step ("firstToolChoice": "required")
  ...(opts.firstToolChoice
    ? { prepareStep: ({ stepNumber }) => (stepNumber === 0 ? { toolChoice: opts.firstToolChoice } : {}) }
    : {}),
  ...(opts.store === false ? { providerOptions: { openai: { store: false } } } : {}),
};

function summary(steps, text, error) {
  return {
    steps: (steps ?? []).map((s) => ({
      finishReason: s.finishReason,
      text: s.text,
      reasoning: s.reasoningText ?? null,
      toolCalls: s.toolCalls.map((c) => ({ toolName: c.toolName, toolCallId: c.toolCallId, input: c.input })),
      toolResults: s.toolResults.map((r) => ({ toolName: r.toolName, toolCallId: r.toolCallId, output: r.output })),
      responseId: s.response?.id ?? null,
      usage: s.usage ?? null,
      warnings: (s.warnings ?? []).map((w) => JSON.stringify(w)),
    })),
    executed,
    text,
    error,
  };
}

function describe(err) {
  if (!err) return null;
  return {
    name: err.name ?? null,
    message: String(err.message ?? err),
    statusCode: err.statusCode ?? err.lastError?.statusCode ?? null,
    responseBody: err.responseBody ?? err.lastError?.responseBody ?? null,
  };
}

let out;
try {
  if (opts.mode === 'generate') {
    const r = await generateText(call);
    out = summary(r.steps, r.text, null);
  } else {
    let streamError = null;
    const r = streamText({ ...call, onError: ({ error }) => { streamError ??= error; } });
    for await (const _ of r.fullStream) { /* drain */ }
    let steps = [];
    let text = null;
    try {
      steps = await r.steps;
      text = await r.text;
    } catch (err) {
      streamError ??= err;
    }
    out = summary(steps, text, describe(streamError));
  }
} catch (err) {
  out = summary([], null, describe(err));
} finally {
  wsFetch?.close();
}
process.stdout.write(JSON.stringify(out) + '\n');
