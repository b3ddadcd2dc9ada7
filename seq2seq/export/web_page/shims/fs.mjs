// sentencepiece-js imports Node's fs for its file loaders, which the page does not use.
export function readFileSync() {
  throw new Error("no file system in the browser");
}
export const readFile = readFileSync;
export const readSync = readFileSync;
