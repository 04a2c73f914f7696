// The console's entry: takes the API key (from `/?api_key=K` once, then sessionStorage, or the login
// form), checks it with /whoami, and routes #/runs, #/runs/NAME and #/clusters to their pages. Each page
// returns a function that stops its polling and streams when the route changes.

import { apiKey, forgetApiKey, onUnauthorized, setApiKey, whoami } from "./api.js";
import { clustersPage } from "./clusters.js";
import { clear, hideBanner, showBanner } from "./dom.js";
import { runPage } from "./run.js";
import { runsPage } from "./runs.js";

const view = document.getElementById("view");
let leavePage = () => {};

// A key in the address bar is moved to sessionStorage and removed from the URL at once, so it is not
// kept in the history, bookmarks or a screenshot.
function takeKeyFromUrl() {
  const url = new URL(location.href);
  const key = url.searchParams.get("api_key");
  if (key === null) return;
  url.searchParams.delete("api_key");
  history.replaceState(null, "", url.pathname + url.search + url.hash);
  if (key.trim()) setApiKey(key.trim());
}

function route() {
  leavePage();
  leavePage = () => {};
  hideBanner();
  const hash = location.hash || "#/runs";
  const run = hash.match(/^#\/runs\/(.+)$/);
  document.querySelectorAll("#nav a").forEach((a) => {
    a.classList.toggle("active", hash.startsWith(`#/${a.dataset.route}`));
  });
  if (run) leavePage = runPage(view, decodeURIComponent(run[1]));
  else if (hash.startsWith("#/clusters")) leavePage = clustersPage(view);
  else leavePage = runsPage(view);
}

function showLogin(message) {
  leavePage();
  leavePage = () => {};
  forgetApiKey();
  document.getElementById("nav").hidden = true;
  document.getElementById("logout-button").hidden = true;
  document.getElementById("whoami").textContent = "";
  const form = document.getElementById("login-template").content.cloneNode(true);
  clear(view).append(form);
  if (message) showBanner(message);
  document.getElementById("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = document.getElementById("login-key").value.trim();
    if (!key) return;
    setApiKey(key);
    start();
  });
  document.getElementById("login-key").focus();
}

async function start() {
  if (!apiKey()) {
    showLogin();
    return;
  }
  let me;
  try {
    me = await whoami();
  } catch (error) {
    if (error.status !== 401) showBanner(`Cannot reach the server: ${error.message}`);
    return;   // a 401 already brought the login form back
  }
  document.getElementById("whoami").textContent = `${me.user} · team ${me.team}${me.admin ? " · admin" : ""}`;
  document.getElementById("nav").hidden = false;
  document.getElementById("logout-button").hidden = false;
  hideBanner();
  route();
}

onUnauthorized((error) => {
  if (apiKey()) showLogin(`Your API key was refused: ${error.message}`);   // once, not per poll
});
window.addEventListener("hashchange", () => {
  if (apiKey()) route();
});
document.getElementById("logout-button").addEventListener("click", () => showLogin());
document.getElementById("banner-close").addEventListener("click", hideBanner);

takeKeyFromUrl();
start();
