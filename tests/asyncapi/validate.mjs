// Validates an AsyncAPI document with the official AsyncAPI parser (npm's @asyncapi/parser 3.x),
// for the event catalogue's AsyncAPI test (tests/it/catalogue.rs).
//
//   node tests/asyncapi/validate.mjs FILE
//
// FILE holds the document, JSON or YAML. The parser is loaded from $OUTBOX_NODE_MODULES (default
// $HOME/.cache/outbox/node/node_modules, where .ci/run installs it), whatever NODE_PATH says.
// Prints each diagnostic as one JSON line {severity, code, message, path}, then a last line
// {"valid": ..., "errors": N, "warnings": M}. Exits 0 when the document parsed with no error,
// 1 otherwise, and 1 with a message on stderr when FILE or the parser cannot be loaded.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { homedir } from 'node:os';
import { join } from 'node:path';

const fail = (message) => {
  process.stderr.write(`validate.mjs: ${message}\n`);
  process.exit(1);
};

const file = process.argv[2];
if (!file) fail('usage: node tests/asyncapi/validate.mjs FILE');

let text;
try {
  text = readFileSync(file, 'utf8');
} catch (e) {
  fail(`cannot read ${file}: ${e.message}`);
}

const modules =
  process.env.OUTBOX_NODE_MODULES || join(homedir(), '.cache', 'outbox', 'node', 'node_modules');
const where = join(modules, '@asyncapi', 'parser');
let Parser;
try {
  ({ Parser } = createRequire(import.meta.url)(where));
} catch (e) {
  const reason = e.message.split('\n')[0];
  fail(`cannot load @asyncapi/parser from ${where} (.ci/run installs it there): ${reason}`);
}

const SEVERITIES = ['error', 'warning', 'info', 'hint']; // DiagnosticSeverity 0..3
const { document, diagnostics } = await new Parser().parse(text);
let errors = 0;
let warnings = 0;
for (const d of diagnostics) {
  const severity = SEVERITIES[d.severity] ?? String(d.severity);
  if (severity === 'error') errors += 1;
  if (severity === 'warning') warnings += 1;
  console.log(JSON.stringify({ severity, code: d.code, message: d.message, path: d.path }));
}
const valid = document !== undefined && errors === 0;
console.log(JSON.stringify({ valid, errors, warnings }));
process.exit(valid ? 0 : 1);
