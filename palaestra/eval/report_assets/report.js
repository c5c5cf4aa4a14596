// Palaestra report: fills each run's rollout browser from the embedded JSON.
// All model text goes through textContent, never innerHTML.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("palaestra-data").textContent);

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function fmt(x) { return typeof x === "number" ? x.toFixed(3) : "—"; }
  function pretty(v) { return typeof v === "string" ? v : JSON.stringify(v, null, 2); }
  function contentText(c) {
    if (c === null || c === undefined) return "";
    if (typeof c === "string") return c;
    if (Array.isArray(c)) {
      return c.map(function (p) { return p && p.type === "text" ? p.text : "[" + ((p && p.type) || "part") + "]"; }).join("\n");
    }
    return pretty(c);
  }
  function callText(call) {
    var f = (call && call.function) || {};
    var args = typeof f.arguments === "string" ? f.arguments : JSON.stringify(f.arguments || {});
    return (f.name || "?") + "(" + args + ")";
  }
  function messages(r) { return (r.prompt || []).concat(r.completion || []); }
  // the task a rollout was given: its prompt's last user message (the prompt's last message otherwise)
  function task(r) {
    var prompt = r.prompt || [];
    var users = prompt.filter(function (m) { return m.role === "user"; });
    var m = users.length ? users[users.length - 1] : prompt[prompt.length - 1];
    return m ? contentText(m.content).replace(/\s+/g, " ").trim() : "";
  }
  function haystack(r) {
    if (r._text === undefined) {
      var parts = ["#" + r.example_id, r.stop_reason || "", r.error ? r.error.type + " " + r.error.message : ""];
      messages(r).forEach(function (m) {
        parts.push(contentText(m.content));
        (m.tool_calls || []).forEach(function (c) { parts.push(callText(c)); });
      });
      r._text = parts.join("\n").toLowerCase();
    }
    return r._text;
  }

  function bubble(m, toolNames) {
    var role = m.role || "?";
    var cls = ["system", "user", "assistant", "tool"].indexOf(role) >= 0 ? role : "other";
    var box = el("div", "msg " + cls);
    var who = role;
    if (role === "tool") {
      var name = toolNames[m.tool_call_id];
      who = "tool result" + (name ? " · " + name : "") + (m.tool_call_id ? " (" + m.tool_call_id + ")" : "");
    }
    box.appendChild(el("div", "who", who));
    var text = contentText(m.content);
    if (m.reasoning_content) box.appendChild(el("div", "text muted", m.reasoning_content));
    if (text) box.appendChild(el("div", "text", text));
    (m.tool_calls || []).forEach(function (c) { box.appendChild(el("div", "toolcall mono", callText(c))); });
    return box;
  }

  function detail(r) {
    var box = el("div", "detail");
    var chat = el("div", "chat");
    var toolNames = {};
    messages(r).forEach(function (m) {
      (m.tool_calls || []).forEach(function (c) { if (c && c.id) toolNames[c.id] = (c.function || {}).name; });
    });
    (r.prompt || []).forEach(function (m) { chat.appendChild(bubble(m, toolNames)); });
    chat.appendChild(el("div", "sep", "completion"));
    (r.completion || []).forEach(function (m) { chat.appendChild(bubble(m, toolNames)); });
    if (!(r.completion || []).length) chat.appendChild(el("div", "sep", "(empty)"));
    box.appendChild(chat);
    var facts = el("div", "facts");
    function fact(k, v) { var s = el("span"); s.appendChild(el("b", null, k + ": ")); s.appendChild(document.createTextNode(v)); facts.appendChild(s); }
    fact("reward", fmt(r.reward));
    Object.keys(r.metrics || {}).forEach(function (k) { fact(k, fmt(r.metrics[k])); });
    fact("stop", r.stop_reason || "none");
    fact("turns", r.turns);
    fact("seed", r.seed);
    if (r.usage) fact("tokens", r.usage.prompt_tokens + " prompt / " + r.usage.completion_tokens + " completion");
    if (r.timing) fact("time", "model " + fmt(r.timing.model) + " s · env " + fmt(r.timing.env) + " s · scoring " + fmt(r.timing.scoring) + " s · total " + fmt(r.timing.total) + " s");
    box.appendChild(facts);
    if (r.error) {
      var eb = el("div", "errbox");
      eb.appendChild(el("b", null, r.error.type + " (stage: " + r.error.stage + ")"));
      eb.appendChild(el("pre", null, r.error.message));
      box.appendChild(eb);
    }
    [["answer", r.answer], ["info", r.info], ["state", r.state]].forEach(function (kv) {
      var v = kv[1];
      if (v === null || v === undefined || (typeof v === "object" && !Array.isArray(v) && !Object.keys(v).length)) return;
      var d = el("details", "more");
      d.appendChild(el("summary", null, kv[0]));
      d.appendChild(el("pre", null, pretty(v)));
      box.appendChild(d);
    });
    return box;
  }

  function row(r) {
    var item = el("div", "row");
    item.setAttribute("role", "listitem");
    var head = el("button", "row-head");
    head.type = "button";
    head.setAttribute("aria-expanded", "false");
    head.appendChild(el("span", "caret", "▸"));
    head.appendChild(el("span", "mono", "#" + r.example_id + " · r" + r.rollout_index));
    var rw = el("span", "reward");
    var bar = el("span", "rbar");
    var fill = el("span");
    fill.style.width = typeof r.reward === "number" ? Math.max(0, Math.min(1, r.reward)) * 100 + "%" : "0";
    bar.appendChild(fill);
    rw.appendChild(bar);
    rw.appendChild(el("span", "mono", fmt(r.reward)));
    head.appendChild(rw);
    var stop = el("span");
    stop.appendChild(el("span", "pill", r.stop_reason || "none"));
    head.appendChild(stop);
    var badge = el("span");
    if (r.error) badge.appendChild(el("span", "badge-err", "error · " + r.error.stage));
    head.appendChild(badge);
    var snippet = el("span", "snippet", task(r).slice(0, 200));
    snippet.title = r.error ? r.error.type + ": " + r.error.message : task(r).slice(0, 2000);
    head.appendChild(snippet);
    item.appendChild(head);
    head.addEventListener("click", function () {
      var open = item.classList.toggle("open");
      head.setAttribute("aria-expanded", String(open));
      if (open && !item._detail) { item._detail = detail(r); item.appendChild(item._detail); }
      if (item._detail) item._detail.hidden = !open;
    });
    return item;
  }

  function setup(root) {
    var rollouts = data.runs[Number(root.dataset.run)] || [];
    var list = root.querySelector(".rows");
    var q = function (c) { return root.querySelector(c); };
    var nodes = rollouts.map(row);
    var stops = {};
    rollouts.forEach(function (r) { var k = r.stop_reason || "none"; stops[k] = (stops[k] || 0) + 1; });
    Object.keys(stops).sort().forEach(function (s) {
      var o = el("option", null, s + " (" + stops[s] + ")");
      o.value = s;
      q(".f-stop").appendChild(o);
    });
    function num(input) { var v = input.value.trim(); return v === "" || isNaN(Number(v)) ? null : Number(v); }
    function apply() {
      var lo = num(q(".f-min")), hi = num(q(".f-max"));
      var errs = q(".f-errors").value, stop = q(".f-stop").value;
      var text = q(".f-search").value.trim().toLowerCase();
      var shown = 0;
      rollouts.forEach(function (r, i) {
        var ok = true;
        if ((lo !== null || hi !== null) && typeof r.reward !== "number") ok = false;
        if (ok && lo !== null && r.reward < lo) ok = false;
        if (ok && hi !== null && r.reward > hi) ok = false;
        if (ok && errs === "errors" && !r.error) ok = false;
        if (ok && errs === "ok" && r.error) ok = false;
        if (ok && stop && (r.stop_reason || "none") !== stop) ok = false;
        if (ok && text && haystack(r).indexOf(text) < 0) ok = false;
        nodes[i].hidden = !ok;
        if (ok) shown++;
      });
      q(".count").textContent = shown + " of " + rollouts.length + " rollouts shown";
    }
    function sort() {
      var how = q(".f-sort").value;
      var order = rollouts.map(function (_, i) { return i; });
      var key = function (i) { var r = rollouts[i].reward; return typeof r === "number" ? r : -Infinity; };
      var byId = function (a, b) {
        var x = rollouts[a], y = rollouts[b];
        return x.example_id - y.example_id || x.rollout_index - y.rollout_index || a - b;
      };
      if (how === "id") order.sort(byId);
      if (how === "reward-asc") order.sort(function (a, b) { return key(a) - key(b) || a - b; });
      if (how === "reward-desc") order.sort(function (a, b) { return key(b) - key(a) || a - b; });
      var frag = document.createDocumentFragment();
      order.forEach(function (i) { frag.appendChild(nodes[i]); });
      list.appendChild(frag);
    }
    [".f-min", ".f-max", ".f-search"].forEach(function (c) { q(c).addEventListener("input", apply); });
    [".f-errors", ".f-stop"].forEach(function (c) { q(c).addEventListener("change", apply); });
    q(".f-sort").addEventListener("change", sort);
    sort();
    apply();
  }

  // the per-example comparison: the examples two runs share, each one's mean reward, both side by side
  function byExample(rollouts) {
    var out = {};
    rollouts.forEach(function (r) { (out[r.example_id] = out[r.example_id] || []).push(r); });
    Object.keys(out).forEach(function (k) { out[k].sort(function (x, y) { return x.rollout_index - y.rollout_index; }); });
    return out;
  }
  function meanReward(rs) {
    var xs = rs.map(function (r) { return r.reward; }).filter(function (x) { return typeof x === "number"; });
    return xs.length ? xs.reduce(function (a, b) { return a + b; }, 0) / xs.length : null;
  }
  function side(label, rs) {
    var col = el("div", "pair-side");
    col.appendChild(el("div", "pair-label", label));
    var pick = el("select", "p-rollout");
    rs.forEach(function (r, i) { var o = el("option", null, "rollout " + r.rollout_index + " · reward " + fmt(r.reward)); o.value = String(i); pick.appendChild(o); });
    col.appendChild(pick);
    var shown = detail(rs[0]);
    col.appendChild(shown);
    pick.addEventListener("change", function () {
      var next = detail(rs[Number(pick.value)]);
      col.replaceChild(next, shown);
      shown = next;
    });
    return col;
  }
  function setupPairs(root) {
    var q = function (c) { return root.querySelector(c); };
    var list = q(".p-rows");
    function build() {
      var a = Number(root.dataset.a), b = Number(q(".p-other").value || root.dataset.b);
      var left = byExample(data.runs[a] || []), right = byExample(data.runs[b] || []);
      var ids = Object.keys(left).filter(function (k) { return right[k]; }).map(Number).sort(function (x, y) { return x - y; });
      var items = ids.map(function (id) {
        var ra = meanReward(left[id]), rb = meanReward(right[id]);
        var d = typeof ra === "number" && typeof rb === "number" ? rb - ra : null;
        var item = el("div", "row pair");
        item.setAttribute("role", "listitem");
        item.dataset.example = String(id);
        var head = el("button", "row-head pair-head");
        head.type = "button";
        head.setAttribute("aria-expanded", "false");
        head.appendChild(el("span", "caret", "▸"));
        head.appendChild(el("span", "mono", "#" + id));
        head.appendChild(el("span", "mono", fmt(ra) + " → " + fmt(rb)));
        var delta = el("span", "delta " + (d === null || Math.abs(d) < 5e-4 ? "zero" : d > 0 ? "pos" : "neg"),
          d === null ? "—" : (d > 5e-4 ? "+" : d < -5e-4 ? "-" : "±") + Math.abs(d).toFixed(3));
        head.appendChild(delta);
        head.appendChild(el("span", "snippet", task(left[id][0]).slice(0, 200)));
        item.appendChild(head);
        head.addEventListener("click", function () {
          var open = item.classList.toggle("open");
          head.setAttribute("aria-expanded", String(open));
          if (open && !item._pair) {
            item._pair = el("div", "pair-body");
            item._pair.appendChild(side("run " + (a + 1), left[id]));
            item._pair.appendChild(side("run " + (b + 1), right[id]));
            item.appendChild(item._pair);
          }
          if (item._pair) item._pair.hidden = !open;
        });
        return { node: item, id: id, delta: d };
      });
      function apply() {
        var differ = q(".p-differ").checked, how = q(".p-sort").value, shown = 0;
        var key = function (x) { return x.delta === null ? 0 : x.delta; };
        var order = items.slice();
        if (how === "delta-asc") order.sort(function (x, y) { return key(x) - key(y) || x.id - y.id; });
        if (how === "delta-desc") order.sort(function (x, y) { return key(y) - key(x) || x.id - y.id; });
        var frag = document.createDocumentFragment();
        order.forEach(function (x) {
          x.node.hidden = differ && (x.delta === null || Math.abs(x.delta) < 5e-4);
          if (!x.node.hidden) shown++;
          frag.appendChild(x.node);
        });
        list.textContent = "";
        list.appendChild(frag);
        q(".p-count").textContent = shown + " of " + items.length + " examples in both runs shown";
      }
      root._apply = apply;
      apply();
    }
    q(".p-other").addEventListener("change", build);
    q(".p-differ").addEventListener("change", function () { root._apply(); });
    q(".p-sort").addEventListener("change", function () { root._apply(); });
    build();
  }

  Array.prototype.forEach.call(document.querySelectorAll(".browser"), setup);
  Array.prototype.forEach.call(document.querySelectorAll(".pairs"), setupPairs);
})();
