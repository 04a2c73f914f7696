// #/clusters: each cluster of the team with its provider, GPU types, nodes (state, health, exclusions)
// and what runs where: the active runs, placed on the nodes of their newest resumption.

import { describeCluster, getRun, listClusters } from "./api.js";
import { clear, every, h, statusBadge } from "./dom.js";

const MAX_PLACED_RUNS = 50;   // runs whose nodes are looked up; beyond that they are listed only

export function clustersPage(view) {
  const list = h("div", { id: "clusters", class: "stack" });
  clear(view).append(h("div", { class: "page-head" }, h("h1", {}, "Clusters")), list);
  return every(5000, async () => {
    const { clusters } = await listClusters();
    const details = await Promise.all(clusters.map((c) => describe(c.name)));
    const placements = await placeRuns(details);
    clear(list).append(...clusters.map((c, i) => clusterCard(c, details[i], placements)));
    if (clusters.length === 0) list.append(h("p", { class: "muted" }, "No clusters."));
  });
}

async function describe(name) {
  try {
    return await describeCluster(name);
  } catch (error) {
    return { error: error.message };
  }
}

// node key "cluster/node" -> [run names], from each active run's newest resumption.
async function placeRuns(details) {
  const names = details.flatMap((d) => d.active_runs || []).slice(0, MAX_PLACED_RUNS);
  const runs = await Promise.all(names.map((name) => getRun(name).catch(() => null)));
  const where = new Map();
  for (const run of runs.filter(Boolean)) {
    const last = run.resumptions[run.resumptions.length - 1];
    for (const node of last ? last.nodes || [] : []) {
      const key = `${run.cluster}/${node}`;
      if (!where.has(key)) where.set(key, []);
      where.get(key).push(run);
    }
  }
  return where;
}

// GPU types and count as MCLI's `get clusters` shows them: from the nodes the cluster reports now (each
// node row of the detail has `gpus` and `gpu_type`), else from the cluster's stored settings.
function gpuFacts(cluster, detail) {
  const nodes = Array.isArray(detail.nodes) ? detail.nodes : [];
  const types = [...new Set(nodes.map((n) => n.gpu_type).filter(Boolean))];
  const counted = nodes.some((n) => Number.isFinite(n.gpus));
  return {
    types: types.length ? types : cluster.gpu_types,
    gpus: counted ? nodes.reduce((sum, n) => sum + (n.gpus || 0), 0) : cluster.gpus ?? "-",
  };
}

function clusterCard(cluster, detail, placements) {
  const gpu = gpuFacts(cluster, detail);
  const facts = [
    ["Provider", cluster.provider || cluster.type || "-"],
    ["GPU types", listText(gpu.types)],
    ["GPUs", gpu.gpus],
    ["Instance", cluster.instance || detail.instance || "-"],
  ];
  return h("section", { class: "card cluster", "data-cluster": cluster.name },
    h("div", { class: "card-head" }, h("h2", {}, cluster.name), h("span", { class: "spacer" }),
      activeRuns(detail)),
    h("dl", { class: "facts inline" }, facts.flatMap(([t, v]) => [h("dt", {}, t), h("dd", {}, String(v))])),
    detail.error ? h("p", { class: "error-text" }, detail.error) : nodeTable(cluster.name, detail, placements));
}

function listText(value) {
  if (Array.isArray(value)) return value.length ? value.join(", ") : "-";
  return value || "-";
}

function activeRuns(detail) {
  const names = detail.active_runs || [];
  if (names.length === 0) return h("span", { class: "muted" }, "no active runs");
  return h("span", {}, `${names.length} active: `,
    names.map((name, i) => [i ? ", " : "", h("a", { href: `#/runs/${encodeURIComponent(name)}` }, name)]));
}

function nodeTable(clusterName, detail, placements) {
  if (!Array.isArray(detail.nodes)) return h("p", { class: "muted" }, `Nodes: ${detail.nodes || "unknown"}`);
  if (detail.nodes.length === 0) return h("p", { class: "muted" }, "No nodes reported.");
  return h("table", { class: "table compact nodes" },
    h("thead", {}, h("tr", {}, ["Node", "State", "GPUs", "Health", "Faults", "Runs"].map((c) => h("th", {}, c)))),
    h("tbody", {}, detail.nodes.map((node) => h("tr", {},
      h("td", {}, node.name),
      h("td", {}, node.state || "-"),
      h("td", {}, node.gpus ? `${node.gpus}${node.gpu_type ? ` x ${node.gpu_type}` : ""}` : "-"),
      h("td", {}, health(node)),
      h("td", { class: "num" }, String(node.faults ?? 0)),
      h("td", {}, (placements.get(`${clusterName}/${node.name}`) || []).map((run) => h("span", { class: "placed" },
        h("a", { href: `#/runs/${encodeURIComponent(run.name)}` }, run.name), " ", statusBadge(run.status))))))));
}

function health(node) {
  if (node.excluded) return h("span", { class: "bad" }, `excluded${node.reason ? `: ${node.reason}` : ""}`);
  if (node.healthy === false) return h("span", { class: "bad" }, node.reason || "unhealthy");
  return h("span", { class: "good" }, "healthy");
}
