// node deploy/local/validate-crds.mjs MODELS_DIR < manifests.json
//
// Validates prometheus-operator objects (ServiceMonitor, PrometheusRule, ...) with the
// validators @kubernetes-models/prometheus-operator compiles from the operator's CRD schemas
// (installed into MODELS_DIR by deploy/local/helm.sh install). stdin: a JSON array of objects.
// Prints one line per object; exits 1 if any is invalid or of a kind it has no validator for.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const modelsDir = process.argv[2];
if (!modelsDir) {
  console.error("usage: validate-crds.mjs MODELS_DIR < manifests.json (MODELS_DIR from deploy/local/helm.sh install)");
  process.exit(2);
}
const pkg = join(modelsDir, "node_modules", "@kubernetes-models", "prometheus-operator");
const objects = JSON.parse(readFileSync(0, "utf8"));
let failed = 0;
for (const obj of objects) {
  const [group, version] = String(obj.apiVersion).split("/");
  const where = `${obj.kind} ${obj.metadata?.name ?? "?"}`;
  if (group !== "monitoring.coreos.com" || !version) {
    console.log(`${where}: not a monitoring.coreos.com object (${obj.apiVersion})`);
    failed++;
    continue;
  }
  let Model;
  try {
    Model = (await import(pathToFileURL(join(pkg, `${group}/${version}/${obj.kind}.js`)).href))[obj.kind];
  } catch (err) {
    console.log(`${where}: no validator for ${obj.apiVersion} ${obj.kind}: ${err.message}`);
    failed++;
    continue;
  }
  try {
    new Model(obj).validate();
    console.log(`${where}: valid`);
  } catch (err) {
    console.log(`${where}: INVALID ${err.message}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
