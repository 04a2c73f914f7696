// One question in a modal <dialog> (move asks the cluster, clone the new name): resolves to the trimmed
// answer, or null when cancelled. `options` are suggestions (a <datalist>), not a closed list.

import { clear, h } from "./dom.js";

export function ask(title, label, { value = "", options = [] } = {}) {
  const dialog = document.getElementById("ask-dialog");
  const form = document.getElementById("ask-form");
  const input = document.getElementById("ask-input");
  document.getElementById("ask-title").textContent = title;
  document.getElementById("ask-label").textContent = label;
  clear(document.getElementById("ask-options")).append(...options.map((o) => h("option", { value: o })));
  input.value = value;

  return new Promise((resolve) => {
    const finish = (answer) => {
      form.removeEventListener("submit", onSubmit);
      cancel.removeEventListener("click", onCancel);
      dialog.removeEventListener("cancel", onCancel);
      if (dialog.open) dialog.close();
      resolve(answer);
    };
    const onSubmit = (event) => {
      event.preventDefault();
      finish(input.value.trim() || null);
    };
    const onCancel = (event) => {
      event.preventDefault();
      finish(null);
    };
    const cancel = document.getElementById("ask-cancel");
    form.addEventListener("submit", onSubmit);
    cancel.addEventListener("click", onCancel);
    dialog.addEventListener("cancel", onCancel);
    dialog.showModal();
    input.select();
  });
}
