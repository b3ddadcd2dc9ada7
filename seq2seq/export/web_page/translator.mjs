// Greedy translation with an exported seq2seq folder: the same rules as seq2seq's search loop
// with beam_size=1 (seq2seq/inference/search_loop.py): the source's pieces cut to
// max_source_length, EOS appended; output ids never PAD or BOS; EOS forced once a sentence has
// floor(max_len_a * n + max_len_b) pieces (n: the source's length with its EOS).
const PAD = 0, BOS = 2, EOS = 3;

export class Translator {
  // ort: onnxruntime-web; pieces: {src, tgt} sentencepiece processors; read(name): file bytes.
  constructor(ort, manifest, encoder, step, pieces, settings) {
    Object.assign(this, { ort, manifest, encoder, step, pieces, settings });
    this.state = manifest.graphs.state;
    this.kept = manifest.tokenizers.tgt_kept_ids;  // output id -> target piece id, or null
    this.tags = Object.entries(manifest.web.user_symbols);  // [tag, its id]: one piece each
  }

  static async load(ort, SentencePieceProcessor, read, settings) {
    const manifest = JSON.parse(new TextDecoder().decode(await read("manifest.json")));
    const session = async (name) => ort.InferenceSession.create(await read(name),
      { executionProviders: ["wasm"] });
    const files = manifest.tokenizers.files;
    const processor = async (name) => {
      const sp = new SentencePieceProcessor();
      const bytes = await read(name);
      let binary = "";
      for (let i = 0; i < bytes.length; i += 0x8000) {
        binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
      }
      await sp.loadFromB64StringModel(btoa(binary));
      return sp;
    };
    const src = await processor(files.src);
    const tgt = files.tgt ? await processor(files.tgt) : src;
    return new Translator(ort, manifest, await session(manifest.graphs.encoder),
      await session(manifest.graphs.decoder_step), { src, tgt },
      { max_source_length: 250, max_len_a: 1.5, max_len_b: 10, ...settings });
  }

  sourceIds(text) {
    const sp = this.pieces.src;
    // A leading corpus tag is one piece, as the tagged training sources were (longest first).
    for (const [tag, id] of this.tags) {
      const escaped = tag.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
      const match = text.match(new RegExp(`^\\s*${escaped}(?:\\s+|$)`));
      if (match) return [id, ...sp.encodeIds(text.slice(match[0].length))];
    }
    return sp.encodeIds(text);
  }

  async translate(text) {
    text = text.split(/\r\n|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]/).join(" ");
    const ids = this.sourceIds(text).slice(0, this.settings.max_source_length);
    if (ids.length === 0) return "";
    const { ort } = this;
    const n = ids.length + 1;
    const src = new ort.Tensor("int64", BigInt64Array.from([...ids, EOS], BigInt), [1, n]);
    const lengths = new ort.Tensor("int64", BigInt64Array.from([BigInt(n)]), [1]);
    const encoded = await this.encoder.run({ src, src_lengths: lengths });
    const outputs = this.encoder.outputNames;
    const [memory, mask, keys] = outputs.slice(0, 3).map((name) => encoded[name]);
    let state = outputs.slice(3).map((name) => encoded[name]);
    const limit = Math.max(0, Math.floor(this.settings.max_len_a * n + this.settings.max_len_b));
    const tokens = [];
    let previous = BOS;
    for (let step = 0; ; step++) {
      const feeds = { prev_tokens: new ort.Tensor("int64", BigInt64Array.from([BigInt(previous)]), [1]),
                      memory, mask, keys };
      this.state.forEach((name, i) => { feeds[this.step.inputNames[4 + i]] = state[i]; });
      const result = await this.step.run(feeds);
      const logits = result[this.step.outputNames[0]].data;
      state = this.step.outputNames.slice(2).map((name) => result[name]);
      let best = EOS;
      if (step < limit) {  // at the limit EOS is forced
        let top = -Infinity;
        for (let id = 0; id < logits.length; id++) {
          if (id !== PAD && id !== BOS && logits[id] > top) { top = logits[id]; best = id; }
        }
      }
      if (best === EOS) break;
      tokens.push(best);
      previous = best;
    }
    const pieces = this.kept ? tokens.map((id) => this.kept[id]) : tokens;
    return this.pieces.tgt.decodeIds(pieces);
  }
}
