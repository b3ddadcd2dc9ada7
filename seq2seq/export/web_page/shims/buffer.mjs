// sentencepiece-js decodes its base64 model with Node's Buffer.from(text, "base64") only.
export const Buffer = {
  from(text, encoding) {
    if (encoding !== "base64") throw new Error(`Buffer.from: ${encoding} is not base64`);
    return Uint8Array.from(atob(text), (character) => character.charCodeAt(0));
  },
};
