// The page: loads the folder's graphs and tokenizers from beside it, then translates greedily
// in the page (translator.mjs); nothing is sent anywhere.
import * as ort from "./runtime/ort.wasm.min.mjs";
import sentencepiece from "./runtime/sentencepiece.mjs";
import { Translator } from "./translator.mjs";

const $ = (id) => document.getElementById(id);
const status = (text) => { $("status").textContent = text; };

async function read(name) {
  const response = await fetch(name);
  if (!response.ok) throw new Error(`${name}: ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

async function main() {
  const opened = performance.now();
  ort.env.wasm.wasmPaths = new URL("./runtime/", import.meta.url).href;
  // Threads need a cross-origin isolated page, which a plain static server does not give.
  ort.env.wasm.numThreads = self.crossOriginIsolated ? Math.min(4, navigator.hardwareConcurrency) : 1;
  const translator = await Translator.load(ort, sentencepiece.SentencePieceProcessor, read, {});
  const { manifest } = translator;
  const data = manifest.config.data || {};
  const state = manifest.trainer_state || {};
  $("languages").textContent = `${data.src_lang || "source"} → ${data.tgt_lang || "target"}`;
  $("bleu").textContent = state.best_bleu != null
    ? `validation BLEU ${Number(state.best_bleu).toFixed(2)} (greedy, during training)` : "";
  $("translate").disabled = false;
  status(`ready in ${((performance.now() - opened) / 1000).toFixed(1)} s`);
  window.seq2seqTranslator = translator;  // for benchmarks/bench_web.py
  window.seq2seqReady = performance.now() - opened;
  $("translate").addEventListener("click", async () => {
    $("translate").disabled = true;
    const started = performance.now();
    const lines = $("source").value.split("\n");
    const translations = [];
    for (const line of lines) translations.push(await translator.translate(line));
    $("output").value = translations.join("\n");
    const seconds = (performance.now() - started) / 1000;
    status(`${lines.length} line(s) in ${seconds.toFixed(2)} s`);
    window.seq2seqTranslated = (window.seq2seqTranslated || 0) + 1;
    $("translate").disabled = false;
  });
}

main().catch((error) => { status(`error: ${error.message}`); window.seq2seqError = error.message; });
