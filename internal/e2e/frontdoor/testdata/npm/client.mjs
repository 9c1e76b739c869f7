// The npm MCP client of the front door's tests: it connects to a toolsvc's
// /mcp with @modelcontextprotocol/sdk, runs the steps of a plan (JSON on
// stdin), and prints one JSON line per step — what the SDK gave it — for
// the Go test to check. A step that fails prints its error and the plan
// goes on.
//
// Plan: {"url", "headers": {...}, "tls": {"ca", "cert", "key"} (files),
//        "steps": [{"op": "list"} | {"op": "call", "name", "arguments", "meta"}]}
import { readFileSync } from "node:fs";
import https from "node:https";
import { Readable } from "node:stream";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const plan = JSON.parse(readFileSync(0, "utf8"));

// tlsFetch is fetch over node:https with the plan's CA and client
// certificate (Node's own fetch takes neither).
function tlsFetch(tls) {
  const agent = new https.Agent({
    ca: readFileSync(tls.ca),
    cert: tls.cert ? readFileSync(tls.cert) : undefined,
    key: tls.key ? readFileSync(tls.key) : undefined,
    keepAlive: true,
  });
  return (input, init = {}) =>
    new Promise((resolve, reject) => {
      const url = input instanceof URL ? input : new URL(typeof input === "string" ? input : input.url);
      const headers = {};
      new Headers(init.headers).forEach((v, k) => (headers[k] = v));
      const req = https.request(url, { method: init.method || "GET", headers, agent, signal: init.signal }, (res) => {
        const h = new Headers();
        for (const [k, v] of Object.entries(res.headers)) {
          for (const x of [].concat(v)) h.append(k, x);
        }
        const body = res.statusCode === 204 || res.statusCode === 202 ? null : Readable.toWeb(res);
        resolve(new Response(body, { status: res.statusCode, headers: h }));
      });
      req.on("error", reject);
      if (init.body) req.write(init.body);
      req.end();
    });
}

const opts = { requestInit: { headers: plan.headers || {} } };
if (plan.tls) opts.fetch = tlsFetch(plan.tls);
const transport = new StreamableHTTPClientTransport(new URL(plan.url), opts);
const client = new Client({ name: "frontdoor-npm-test", version: "1.0.0" });

function out(line) {
  process.stdout.write(JSON.stringify(line) + "\n");
}

try {
  await client.connect(transport);
  out({ step: "connect", ok: true, protocolVersion: transport.protocolVersion, instructions: client.getInstructions() });
} catch (e) {
  out({ step: "connect", ok: false, error: String(e && e.message ? e.message : e) });
  process.exit(0);
}

for (const [i, s] of (plan.steps || []).entries()) {
  try {
    if (s.op === "list") {
      const r = await client.listTools();
      out({ step: i, ok: true, tools: r.tools });
    } else if (s.op === "call") {
      const r = await client.callTool({ name: s.name, arguments: s.arguments || {}, _meta: s.meta }, undefined, { timeout: 120000 });
      out({ step: i, ok: true, result: r });
    } else {
      out({ step: i, ok: false, error: "unknown op " + s.op });
    }
  } catch (e) {
    out({ step: i, ok: false, error: String(e && e.message ? e.message : e), code: e && e.code });
  }
}
await client.close();
