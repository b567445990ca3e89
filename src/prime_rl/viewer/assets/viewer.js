// The rollout viewer's script (prime_rl/viewer). Every piece of run data reaches the page as text: elements are
// made with createElement and filled with textContent, never parsed as markup, and the page's policy runs this
// script alone. A step's data sits in a JSON script block (type application/json) of the page, parsed when the
// step is opened, or for a large run in the step file beside the page (meta.step_files/step_N.js), loaded then: it
// calls window.primeRlStep(N, rows).
"use strict";

const meta = JSON.parse(document.getElementById("run-meta").textContent);
const cache = new Map();
const state = {step: meta.steps[0], group: null, env: "", rmin: "", rmax: "", errors: false, kept: "all",
               colour: "text", query: ""};
const COLOURS = {text: "text", logprob: "sampler logprob", ratio: "ratio trainer/sampler",
                 advantage: "advantage", outcome: "loss outcome"};
const OUTCOMES = {"-": "not trained", k: "kept", l: "low bound", h: "high bound", x: "non-finite ratio",
                  r: "rejected by a correction rule"};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

const waiting = new Map();  // step -> the resolve of its file's load

window.primeRlStep = function (step, rows) {
  cache.set(step, rows);
  const done = waiting.get(step);
  if (done) { waiting.delete(step); done(rows); }
};

function loadStep(step) {  // a Promise of the step's rows
  if (cache.has(step)) return Promise.resolve(cache.get(step));
  const block = document.getElementById("step-" + step);
  if (block) {
    cache.set(step, JSON.parse(block.textContent));
    return Promise.resolve(cache.get(step));
  }
  return new Promise((resolve, reject) => {
    const src = encodeURIComponent(meta.step_files) + "/step_" + Number(step) + ".js";
    waiting.set(step, resolve);
    const script = el("script", {src: src});
    const fail = reason => { if (waiting.delete(step)) reject(new Error(reason)); };
    script.addEventListener("error", () => fail("cannot load " + src));
    script.addEventListener("load", () => fail(src + " does not hold step " + step));  // ran, but no primeRlStep(step)
    document.head.append(script);
  });
}

function fmt(value, digits) {
  if (value === null || value === undefined) return "–";
  return typeof value === "number" ? value.toFixed(digits === undefined ? 3 : digits) : String(value);
}

function textOf(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map(part => part && typeof part.text === "string" ? part.text : "").join("");
  return content === null || content === undefined ? "" : JSON.stringify(content);
}

function messageText(message) {
  let text = textOf(message.content);
  for (const call of message.tool_calls || []) {
    const fn = call.function || {};
    text += (text ? "\n" : "") + "→ " + (fn.name || "?") + "(" + textOf(fn.arguments) + ")";
  }
  return text;
}

function isNumber(value) {
  return typeof value === "number" && isFinite(value);
}

function matches(row) {
  if (state.env && String(row.env) !== state.env) return false;
  if (state.rmin !== "" && !(row.reward >= Number(state.rmin))) return false;
  if (state.rmax !== "" && !(row.reward <= Number(state.rmax))) return false;
  if (state.errors && !row.error) return false;
  if (state.kept === "kept" && !row.kept) return false;
  if (state.kept === "dropped" && row.kept) return false;
  if (state.query) {
    const haystack = ((row.completion || "") + "\n" + (row.messages || []).map(messageText).join("\n")).toLowerCase();
    if (!haystack.includes(state.query.toLowerCase())) return false;
  }
  return true;
}

function groupsOf(rows) {
  const groups = new Map();
  for (const row of rows) {
    if (!groups.has(row.group)) groups.set(row.group, []);
    groups.get(row.group).push(row);
  }
  return groups;
}

// ---- the address holds the whole view (step, group, colouring, filters), so a view has a link -------------------

const FILTERS = ["env", "rmin", "rmax", "query"];

function writeHash() {
  const params = new URLSearchParams({step: state.step});
  if (state.group !== null) params.set("group", state.group);
  if (state.colour !== "text") params.set("colour", state.colour);
  for (const key of FILTERS) if (state[key] !== "") params.set(key, state[key]);
  if (state.errors) params.set("errors", "1");
  if (state.kept !== "all") params.set("kept", state.kept);
  history.replaceState(null, "", "#" + params.toString());
}

function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  const step = Number(params.get("step"));
  if (params.has("step") && meta.steps.includes(step)) state.step = step;
  state.group = params.has("group") ? Number(params.get("group")) : null;
  const colour = params.get("colour");
  state.colour = colour !== null && Object.hasOwn(COLOURS, colour) ? colour : "text";
  for (const key of FILTERS) state[key] = params.get(key) || "";
  state.errors = params.get("errors") === "1";
  state.kept = ["kept", "dropped"].includes(params.get("kept")) ? params.get("kept") : "all";
}

function go(changes) {
  Object.assign(state, changes);
  writeHash();
  render();
}

// ---- the reward curve --------------------------------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  return node;
}

function curve() {
  const points = meta.curve.filter(p => p[1] !== null);
  const box = el("div", {class: "curve", id: "curve"});
  if (!points.length) return box;
  const W = 1000, H = 120, pad = 6;
  const steps = points.map(p => p[0]), values = points.map(p => p[1]);
  const x0 = Math.min(...steps), x1 = Math.max(...steps, x0 + 1);
  let y0 = Math.min(...values), y1 = Math.max(...values);
  if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
  const X = s => pad + (W - 2 * pad) * (s - x0) / (x1 - x0);
  const Y = v => H - pad - (H - 2 * pad) * (v - y0) / (y1 - y0);
  const chart = svg("svg", {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img"});
  chart.append(svg("polyline", {points: points.map(p => X(p[0]) + "," + Y(p[1])).join(" "), class: "line"}));
  const selected = svg("line", {x1: X(state.step), x2: X(state.step), y1: 0, y2: H, class: "selected"});
  chart.append(selected);
  const width = Math.max((W - 2 * pad) / Math.max(meta.steps.length, 1), 2);
  for (const step of meta.steps) {
    const hit = svg("rect", {x: X(step) - width / 2, y: 0, width: width, height: H, class: "hit",
                             "data-step": step});
    const title = svg("title", {});
    const point = points.find(p => p[0] === step);
    title.textContent = "step " + step + (point ? ": reward " + fmt(point[1]) : "");
    hit.append(title);
    hit.addEventListener("click", () => go({step: step, group: null}));
    chart.append(hit);
  }
  box.append(el("div", {class: "axis", text: `reward ${fmt(y0)} … ${fmt(y1)} over steps ${x0} … ${x1}` +
                                                " (click a step)"}), chart);
  return box;
}

// ---- controls ---------------------------------------------------------------------------------------------------

function controls() {
  const step = el("select", {id: "step", onchange: e => go({step: Number(e.target.value), group: null})});
  for (const s of meta.steps) step.append(el("option", {value: s, text: "step " + s}));
  step.value = state.step;
  const index = meta.steps.indexOf(state.step);
  const prev = el("button", {id: "prev", text: "‹", title: "previous step",
                             onclick: () => index > 0 && go({step: meta.steps[index - 1], group: null})});
  const next = el("button", {id: "next", text: "›", title: "next step",
                             onclick: () => index < meta.steps.length - 1 && go({step: meta.steps[index + 1], group: null})});
  const env = el("select", {id: "env", onchange: e => go({env: e.target.value})});
  env.append(el("option", {value: "", text: "every environment"}));
  for (const name of meta.envs) env.append(el("option", {value: name, text: name}));
  env.value = state.env;
  const number = (id, value, label) => el("input", {id: id, type: "number", step: "any", placeholder: label,
                                                    value: value, onchange: e => go({[id]: e.target.value})});
  const errors = el("input", {id: "errors", type: "checkbox", onchange: e => go({errors: e.target.checked})});
  errors.checked = state.errors;
  const kept = el("select", {id: "kept", onchange: e => go({kept: e.target.value})});
  for (const [value, text] of [["all", "kept and dropped"], ["kept", "kept (trains)"], ["dropped", "dropped"]])
    kept.append(el("option", {value: value, text: text}));
  kept.value = state.kept;
  const colour = el("select", {id: "colour", onchange: e => go({colour: e.target.value})});
  for (const [value, text] of Object.entries(COLOURS)) colour.append(el("option", {value: value, text: "colour: " + text}));
  colour.value = state.colour;
  const query = el("input", {id: "query", type: "search", placeholder: "text in the conversation", value: state.query,
                             onchange: e => go({query: e.target.value})});
  return el("div", {class: "controls"}, prev, step, next, env, number("rmin", state.rmin, "reward ≥"),
            number("rmax", state.rmax, "reward ≤"), el("label", {}, errors, " errors only"), kept, colour, query);
}

// ---- tokens -----------------------------------------------------------------------------------------------------

function mix(rgb, t) {
  const a = Math.max(0, Math.min(1, t)) * 0.85;
  return `rgba(${rgb[0]},${rgb[1]},${rgb[2]},${a.toFixed(3)})`;
}

const NONFINITE = "rgba(120,120,120,0.85)", NOT_TRAINED = "rgba(110,140,170,0.35)", CUT = "rgba(250,220,120,0.6)";
const REJECTED = "rgba(200,40,40,0.55)";
const RED = [220, 40, 40], BLUE = [40, 90, 220], GREEN = [30, 150, 60], ORANGE = [235, 140, 0], PURPLE = [140, 50, 190];

function logRatio(tokens, i) {
  const t = tokens.trainer_logprobs ? tokens.trainer_logprobs[i] : undefined;
  return isNumber(t) && isNumber(tokens.logprobs[i]) ? t - tokens.logprobs[i] : null;
}

function tokenAdvantage(tokens, i, advantage) {
  // the trainer's per-token advantage (what the step trained with) where it recorded one, else the rollout's
  if (tokens.advantages && i < tokens.advantages.length) return tokens.advantages[i];
  return advantage;
}

function tokenColour(mode, tokens, i, advantage) {
  if (!tokens.sampled[i]) return null;
  if (mode === "logprob") return isNumber(tokens.logprobs[i]) ? mix(RED, -tokens.logprobs[i] / 5) : NONFINITE;
  if (mode === "advantage") {
    const a = tokenAdvantage(tokens, i, advantage);
    return isNumber(a) ? mix(a >= 0 ? GREEN : RED, Math.abs(a) / 2) : null;
  }
  if (mode === "ratio") {
    const logr = logRatio(tokens, i);
    return logr === null ? null : mix(logr >= 0 ? BLUE : RED, Math.abs(logr) / 0.5);
  }
  if (mode === "outcome") {
    if (tokens.outcomes === undefined) return null;
    if (i >= tokens.outcomes.length) return CUT;  // cut to seq_len by the orchestrator: never in the batch
    return {"-": NOT_TRAINED, l: mix(ORANGE, 1), h: mix(PURPLE, 1), x: NONFINITE, r: REJECTED}[tokens.outcomes[i]] ||
      null;
  }
  return null;
}

function tokenTitle(tokens, i, step) {
  const lines = ["id " + tokens.ids[i]];
  if (tokens.sampled[i]) lines.push("sampler logprob " + fmt(tokens.logprobs[i], 4));
  if (tokens.trainer_logprobs && i < tokens.trainer_logprobs.length) {
    lines.push("trainer logprob " + fmt(tokens.trainer_logprobs[i], 4));
    const logr = logRatio(tokens, i);
    if (tokens.sampled[i] && logr !== null) lines.push("ratio " + fmt(Math.exp(logr), 4));
  }
  if (tokens.advantages && i < tokens.advantages.length) lines.push("trained with advantage " + fmt(tokens.advantages[i], 4));
  if (tokens.outcomes !== undefined) {
    lines.push(i < tokens.outcomes.length ? "loss: " + OUTCOMES[tokens.outcomes[i]]
                                          : "cut to seq_len: not in the batch");
  }
  if (tokens.weight_steps && tokens.weight_steps[i] !== undefined)
    lines.push("weights of step " + tokens.weight_steps[i] + " (lag " + (step - tokens.weight_steps[i]) + ")");
  if (!tokens.sampled[i]) lines.push("not sampled by the policy (an environment's or template's token)");
  return lines.join("\n");
}

function tokenView(row) {
  const box = el("div", {class: "tokens"});
  (row.tokens || []).forEach((tokens, segment) => {
    if (row.tokens.length > 1) box.append(el("div", {class: "segment", text: "sample " + (segment + 1)}));
    const line = el("div", {class: "text"});
    for (let i = 0; i < tokens.ids.length; i++) {
      const text = meta.vocab[tokens.ids[i]];
      const span = el("span", {class: tokens.sampled[i] ? "tok" : "tok env",
                               text: text === undefined ? "#" + tokens.ids[i] : text});
      const colour = tokenColour(state.colour, tokens, i, row.advantage);
      if (colour) span.style.background = colour;
      span.title = tokenTitle(tokens, i, row.step);
      line.append(span);
    }
    box.append(line);
    if (state.colour === "ratio" || state.colour === "outcome") {
      if (tokens.outcomes === undefined) box.append(el("div", {class: "note", text: "no trainer record for this sample (the " +
                                                  "trainer has not trained this step yet, or the group was dropped)"}));
    }
  });
  if (!(row.tokens || []).length) box.append(el("div", {class: "note", text: "no tokens recorded"}));
  return box;
}

// ---- a group, side by side ---------------------------------------------------------------------------------------

function messagesView(messages, cls) {
  const box = el("div", {class: cls});
  for (const message of messages || []) {
    box.append(el("div", {class: "message " + (message.role || "")},
                  el("span", {class: "role", text: message.role || "?"}),
                  el("div", {class: "text", text: messageText(message)})));
  }
  return box;
}

function rolloutView(row) {
  const head = el("div", {class: "head"},
    el("span", {class: "reward", text: "reward " + fmt(row.reward)}),
    el("span", {text: row.kept ? "advantage " + fmt(row.advantage) : "dropped"}),
    el("span", {text: row.finish_reason + (row.truncated ? " (truncated)" : "")}),
    el("span", {text: "lag " + row.policy_lag}),
    el("span", {text: row.completion_tokens + " tokens"}));
  const parts = Object.entries(row.components || {}).map(([name, value]) => name + " " + fmt(value)).join(" · ");
  return el("div", {class: "rollout" + (row.error ? " failed" : ""), "data-rollout": row.rollout},
    el("div", {class: "title", text: "rollout " + row.rollout}), head,
    parts ? el("div", {class: "components", text: parts}) : null,
    row.error ? el("div", {class: "error", text: row.error}) : null,
    state.colour === "text" ? messagesView(row.messages && row.messages.length ? row.messages
                                           : [{role: "assistant", content: row.completion}], "messages")
                            : tokenView(row));
}

function groupDetail(rows, shown) {
  const first = rows[0];
  const box = el("section", {id: "detail"});
  box.append(el("h2", {text: `group ${first.group} · ${first.env} · ${shown.length} of ${rows.length} rollouts shown`}));
  box.append(el("div", {class: "label", text: "prompt"}), messagesView(first.prompt, "prompt"));
  if (first.answer !== null && first.answer !== undefined && first.answer !== "")
    box.append(el("div", {class: "label", text: "answer"}), el("div", {class: "text answer", text: textOf(first.answer)}));
  if (state.colour !== "text") box.append(legend());
  box.append(el("div", {class: "rollouts"}, ...shown.map(rolloutView)));
  return box;
}

function legend() {
  const items = {
    logprob: [["0", null], ["-2.5", mix(RED, 0.5)], ["≤ -5", mix(RED, 1)]],
    ratio: [["r < 1", mix(RED, 1)], ["r = 1", null], ["r > 1", mix(BLUE, 1)], ["(|log r| ≥ 0.5 full colour)", null]],
    advantage: [["A < 0", mix(RED, 1)], ["A > 0", mix(GREEN, 1)], ["(|A| ≥ 2 full colour)", null]],
    outcome: [["kept", null], ["low bound", mix(ORANGE, 1)], ["high bound", mix(PURPLE, 1)], ["non-finite", NONFINITE],
              ["rejected (correction)", REJECTED], ["not trained", NOT_TRAINED], ["cut to seq_len", CUT]],
  }[state.colour];
  const box = el("div", {class: "legend"}, el("span", {text: COLOURS[state.colour] + ":"}));
  for (const [text, colour] of items) {
    const swatch = el("span", {class: "tok", text: text});
    if (colour) swatch.style.background = colour;
    box.append(swatch);
  }
  box.append(el("span", {class: "tok env", text: "not sampled"}));
  return box;
}

function groupCard(rows, shown) {
  const first = rows[0];
  const users = (first.prompt || []).filter(m => m.role === "user");
  const prompt = users.length ? textOf(users[users.length - 1].content) : "";
  const chips = el("div", {class: "chips"});
  for (const row of rows) {
    const chip = el("span", {class: "chip" + (shown.includes(row) ? "" : " hidden") + (row.error ? " failed" : ""),
                             text: fmt(row.reward, 2)});
    const reward = isNumber(row.reward) ? Math.max(0, Math.min(1, row.reward)) : null;
    chip.style.background = reward === null ? NONFINITE : mix(reward >= 0.5 ? GREEN : RED, Math.abs(reward - 0.5) * 2);
    chips.append(chip);
  }
  return el("div", {class: "group-card" + (state.group === first.group ? " open" : ""), "data-group": first.group,
                    onclick: () => go({group: state.group === first.group ? null : first.group})},
    el("div", {class: "title", text: `group ${first.group} · ${first.env}` + (first.kept ? "" : " · dropped")}),
    el("div", {class: "prompt-line", text: prompt}), chips);
}

// ---- the page ---------------------------------------------------------------------------------------------------

function summary(rows, step) {
  const rewards = rows.map(r => r.reward).filter(v => typeof v === "number");
  const mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : null;
  const groups = new Set(rows.map(r => r.group)).size;
  const failed = rows.filter(r => r.error).length, truncated = rows.filter(r => r.truncated).length;
  const dropped = rows.filter(r => !r.kept).length;
  let text = `step ${step}: ${rows.length} rollouts in ${groups} groups, mean reward ${fmt(mean)}, ` +
             `${failed} failed, ${truncated} truncated, ${dropped} in dropped groups`;
  if (meta.left_out[step]) text += `, ${meta.left_out[step]} left out of the file (max_mib)`;
  return el("div", {class: "summary", id: "summary", text: text});
}

function render() {
  const step = state.step;
  loadStep(step).then(rows => { if (state.step === step) draw(rows); }, error => {
    if (state.step === step) draw([], `step ${step}: ${error.message} (the page's ${meta.step_files}/ folder ` +
                                      "must stay beside it)");
  });
}

function draw(rows, problem) {
  const groups = groupsOf(rows);
  const list = el("section", {id: "groups"});
  let detail = null;
  for (const [group, members] of groups) {
    const shown = members.filter(matches);
    if (!shown.length) continue;
    list.append(groupCard(members, shown));
    if (group === state.group) detail = groupDetail(members, shown);
  }
  if (!list.children.length) {
    list.append(el("div", {class: "note", text: problem || "no rollout of this step passes the filters"}));
  }
  const app = document.getElementById("app");
  app.replaceChildren(
    el("header", {}, el("h1", {text: "rollouts of " + meta.name}),
       ...meta.notes.map(note => el("div", {class: "note", text: note}))),
    curve(), controls(), summary(rows, state.step),
    el("main", {}, list, detail || el("section", {id: "detail", class: "empty",
                                                   text: "click a group to read its rollouts side by side"})));
  document.documentElement.dataset.ready = "1";
}

readHash();
render();
window.addEventListener("hashchange", () => { readHash(); render(); });
