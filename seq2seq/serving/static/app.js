// The page of seq2seq-serve: translate with one model or all of them side by side, and draw
// each sentence's attention as a matrix (source pieces across, target pieces down) that
// answers hovering. Plain JS, no dependencies, nothing fetched from anywhere but this server.
"use strict";

const ALL = "__all__";
const $ = (id) => document.getElementById(id);
let models = [];

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

// White to blue: the colour of an attention weight in [0, 1].
function shade(weight) {
  const w = Math.max(0, Math.min(1, weight));
  const r = Math.round(255 - 219 * w), g = Math.round(255 - 166 * w), b = Math.round(255 - 59 * w);
  return `rgb(${r}, ${g}, ${b})`;
}

function showPiece(piece) {
  return piece === "</s>" ? piece : piece.replace(/\u2581/g, "\u00b7") || "\u00a0";
}

async function loadModels() {
  const response = await fetch("/v1/models");
  const body = await response.json();
  models = body.models;
  const select = $("model");
  select.replaceChildren();
  if (models.length > 1) select.append(el("option", { value: ALL, text: "all models, side by side" }));
  for (const m of models) {
    select.append(el("option", { value: m.name, text: `${m.name} (${m.scorer || "?"})` }));
  }
  $("beam").value = models[0].defaults.beam_size || 5;
}

// One attention matrix, with its hover behaviour. rows: target pieces + </s>,
// columns: source pieces + </s>.
function attentionTable(sourcePieces, targetPieces, weights, info) {
  const sources = [...sourcePieces, "</s>"].map(showPiece);
  const targets = [...targetPieces, "</s>"].map(showPiece);
  const table = el("table", { class: "attention" });
  const head = el("tr", {}, el("th"));
  const colHeads = sources.map((piece, j) => el("th", { class: "src", "data-j": j, text: piece }));
  head.append(...colHeads);
  table.append(el("thead", {}, head));
  const body = el("tbody");
  const rowHeads = [], cells = [];
  targets.forEach((piece, i) => {
    const rowHead = el("th", { class: "tgt", "data-i": i, text: piece });
    rowHeads.push(rowHead);
    const row = el("tr", {}, rowHead);
    cells.push([]);
    sources.forEach((_, j) => {
      const w = weights[i][j];
      const cell = el("td", { class: "cell", "data-i": i, "data-j": j, "data-weight": w.toFixed(4),
                              title: `${targets[i]} \u2192 ${sources[j]}: ${w.toFixed(3)}` });
      cell.style.background = shade(w);
      cells[i].push(cell);
      row.append(cell);
    });
    body.append(row);
  });
  table.append(body);

  const clear = () => {
    for (const h of [...rowHeads, ...colHeads]) { h.classList.remove("hl"); h.style.background = ""; }
    for (const row of cells) for (const c of row) c.classList.remove("hl", "focus");
    info.textContent = "";
  };
  const top = (pairs) => pairs.filter(([, w]) => w >= 0.05).sort((a, b) => b[1] - a[1]).slice(0, 4)
    .map(([p, w]) => `${p} ${w.toFixed(2)}`).join(", ");
  table.addEventListener("mouseover", (event) => {
    const target = event.target.closest("td, th");
    if (!target || !table.contains(target)) return;
    clear();
    if (target.classList.contains("cell")) {
      const i = +target.dataset.i, j = +target.dataset.j;
      target.classList.add("focus");
      rowHeads[i].classList.add("hl");
      colHeads[j].classList.add("hl");
      info.textContent = `${targets[i]} \u2192 ${sources[j]}: ${weights[i][j].toFixed(4)}`;
    } else if (target.classList.contains("tgt")) {
      const i = +target.dataset.i;
      target.classList.add("hl");
      colHeads.forEach((h, j) => { h.style.background = shade(weights[i][j]); cells[i][j].classList.add("hl"); });
      info.textContent = `${targets[i]} attends to ${top(sources.map((p, j) => [p, weights[i][j]]))}`;
    } else if (target.classList.contains("src")) {
      const j = +target.dataset.j;
      target.classList.add("hl");
      rowHeads.forEach((h, i) => { h.style.background = shade(weights[i][j]); cells[i][j].classList.add("hl"); });
      info.textContent = `${sources[j]} is attended by ${top(targets.map((p, i) => [p, weights[i][j]]))}`;
    }
  });
  table.addEventListener("mouseleave", clear);
  return table;
}

// The mean of the chosen matrices of heads[layer][head] ("mean": every layer, or every head).
function meanOfHeads(heads, layer, head) {
  const chosen = [];
  heads.forEach((layerHeads, l) => {
    if (layer !== "mean" && +layer !== l) return;
    layerHeads.forEach((matrix, h) => { if (head === "mean" || +head === h) chosen.push(matrix); });
  });
  return chosen[0].map((row, i) => row.map((_, j) =>
    chosen.reduce((sum, matrix) => sum + matrix[i][j], 0) / chosen.length));
}

// A Transformer's layer and head picker (the BertViz idea): redraws with the chosen matrix.
function headPicker(heads, draw) {
  const layer = el("select", { class: "layer" }, el("option", { value: "mean", text: "mean" }));
  heads.forEach((_, l) => layer.append(el("option", { value: l, text: `${l + 1}` })));
  const head = el("select", { class: "head" }, el("option", { value: "mean", text: "mean" }));
  heads[0].forEach((_, h) => head.append(el("option", { value: h, text: `${h + 1}` })));
  const pick = () => draw(meanOfHeads(heads, layer.value, head.value));
  layer.addEventListener("change", pick);
  head.addEventListener("change", pick);
  return el("div", { class: "picker" }, el("label", {}, "Layer ", layer), el("label", {}, "Head ", head));
}

function panel(name, entry) {
  const m = models.find((x) => x.name === name);
  const box = el("div", { class: "panel", "data-model": name });
  box.append(el("h3", {}, name, " ", el("small", { text: m && m.scorer ? m.scorer : "" })));
  box.append(el("p", { class: "translation", text: entry.text }));
  box.append(el("p", { class: "score", text: `score ${entry.score.toFixed(3)}` }));
  const best = entry.hypotheses[0];
  if (best.attention) {
    const info = el("div", { class: "info" });
    const matrix = el("div", { class: "matrix" });
    const draw = (weights) => matrix.replaceChildren(
      attentionTable(entry.source_pieces, best.target_pieces, weights, info));
    draw(best.attention);
    if (best.attention_heads) box.append(headPicker(best.attention_heads, draw));
    // A runtime whose attention is not the model's own (a CTranslate2 folder) says what it is.
    if (m && m.attention) box.append(el("p", { class: "note", text: `Attention: ${m.attention}` }));
    box.append(matrix, info);
  } else {
    box.append(el("p", { class: "empty", text: "(no attention: empty sentence)" }));
  }
  return box;
}

async function translate(event) {
  event.preventDefault();
  const lines = $("text").value.split("\n").map((l) => l.trim()).filter((l) => l);
  if (!lines.length) { setStatus("Type a sentence first."); return; }
  const choice = $("model").value;
  const names = choice === ALL ? models.map((m) => m.name) : [choice];
  const beam = parseInt($("beam").value, 10) || 1;
  const search = $("search").value;
  // The same phrases for every line; the server refuses them with sampling, in one line.
  const phrases = $("phrases").value.split(";").map((p) => p.trim()).filter((p) => p);
  const options = { beam_size: beam, search };
  if (phrases.length) options.constraints = lines.map(() => phrases);
  $("translate").disabled = true;
  setStatus("Translating\u2026");
  const started = performance.now();
  try {
    const answers = await Promise.all(names.map(async (name) => {
      const response = await fetch("/v1/translate", {
        method: "POST", headers: { "content-type": "application/json" },
        body: JSON.stringify({ text: lines, model: name, ...options, attention: true,
                               attention_heads: true }),
      });
      const body = await response.json();
      if (!response.ok) throw new Error(`${name}: ${body.error || response.statusText}`);
      return body;
    }));
    const results = $("results");
    results.replaceChildren();
    lines.forEach((line, index) => {
      const panels = el("div", { class: "panels" });
      answers.forEach((answer) => panels.append(panel(answer.model, answer.translations[index])));
      results.append(el("section", { class: "sentence" }, el("h2", { text: line }), panels));
    });
    setStatus(`${lines.length} sentence(s), ${names.length} model(s), ${Math.round(performance.now() - started)} ms`);
  } catch (error) {
    setStatus(error.message, true);
  } finally {
    $("translate").disabled = false;
  }
}

$("form").addEventListener("submit", translate);
$("text").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("form").requestSubmit();
});
loadModels().catch((error) => setStatus(`cannot list the models: ${error.message}`, true));
