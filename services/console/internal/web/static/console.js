// lossless console: the live parts, no build step. Pages work without it
// (they are server-rendered); with it the Overview and an order's timeline
// update every second without reloading.
"use strict";

(function () {
  var PERIOD = 1000;

  function get(obj, path) {
    return path.split(".").reduce(function (o, k) { return o == null ? undefined : o[k]; }, obj);
  }

  function format(v, kind) {
    if (v === undefined || v === null) { return "0"; }
    switch (kind) {
      case "rate": return Number(v).toFixed(2);
      case "seconds": return Number(v).toFixed(2) + " s";
      case "sum":
        return String(Object.keys(v).reduce(function (s, k) { return s + v[k]; }, 0));
      default: return String(Math.round(Number(v)));
    }
  }

  // poll calls url every PERIOD ms, one request at a time, and hands the JSON
  // to apply; apply returns false to stop.
  function poll(url, apply, onError) {
    function tick() {
      fetch(url, { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } })
        .then(function (r) {
          if (!r.ok && r.status !== 404) { throw new Error("HTTP " + r.status); }
          return r.json();
        })
        .then(function (d) { if (apply(d) !== false) { setTimeout(tick, PERIOD); } })
        .catch(function (e) { onError(e); setTimeout(tick, PERIOD); });
    }
    setTimeout(tick, PERIOD);
  }

  function overview(root) {
    var problem = root.querySelector('[data-figure="problem"]');
    var unreachable = root.querySelector('[data-figure="unreachable"]');
    var updated = root.querySelector('[data-figure="updated"]');
    var figures = root.querySelectorAll("[data-figure][data-format]");
    function fill(d) {
      figures.forEach(function (el) { el.textContent = format(get(d, el.dataset.figure), el.dataset.format); });
      updated.textContent = new Date(d.time).toISOString().slice(11, 19);
      var msgs = [];
      if (d.error) { msgs.push(d.error); }
      if (d.latency && d.latency.error) { msgs.push(d.latency.error); }
      problem.hidden = msgs.length === 0;
      problem.textContent = msgs.join(" ");
      var down = d.unreachable ? Object.keys(d.unreachable) : [];
      unreachable.hidden = down.length === 0;
      unreachable.textContent = down.map(function (k) { return k + ": " + d.unreachable[k]; }).join("; ");
    }
    poll(root.dataset.live, fill, function (e) { problem.hidden = false; problem.textContent = "Console unreachable: " + e.message; });
  }

  // el makes an element with text.
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined) { e.textContent = text; }
    if (cls) { e.className = cls; }
    return e;
  }

  // order keeps an order's page live: its status, the timeline merged from
  // every source (templates/order.html renders the same markup) and how
  // each source fared.
  function order(root) {
    if (root.dataset.terminal === "true") { return; }
    var id = root.dataset.orderId;
    var status = root.querySelector('[data-order-field="status"]');
    var list = root.querySelector('[data-order-field="timeline"]');
    var sources = root.querySelector('[data-order-field="sources"]');
    var live = root.querySelector('[data-order-field="live"]');
    poll("/api/orders/" + encodeURIComponent(id), function (d) {
      if (!d.status) { return true; }
      status.textContent = d.status;
      status.className = "status s-" + d.status;
      list.replaceChildren.apply(list, (d.timeline || []).map(function (t) {
        var li = el("li");
        li.dataset.kind = t.kind;
        li.dataset.service = t.service;
        var time = el("time", t.time);
        time.setAttribute("datetime", t.iso);
        li.append(time, " ", el("span", t.service, "svc"), " ", el("strong", t.what));
        if (t.details && t.details.length) { li.append(" ", el("span", t.details.join(" · "), "muted")); }
        return li;
      }));
      sources.replaceChildren.apply(sources, (d.sources || []).map(function (s) {
        var li = el("li");
        li.dataset.source = s.name;
        li.append(el("strong", s.name), " ", el("span", "(" + s.service + ")", "muted"), ": ");
        if (s.login_needed) {
          var a = el("a", "log in to see");
          a.href = "/login?next=" + encodeURIComponent("/orders/" + id);
          li.append(a);
        } else if (s.error) {
          var e = el("span", s.error, "error");
          e.setAttribute("role", "alert");
          li.append(e);
        } else {
          li.append(s.shown + " shown" + (s.note ? "; " + s.note : ""));
        }
        return li;
      }));
      if (d.terminal) {
        live.textContent = "Final." + (d.invoice_id ? " Reload for the invoice's lines." : "");
        return false;
      }
      return true;
    }, function () { live.textContent = "Updates paused: console unreachable; retrying."; });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var o = document.getElementById("overview");
    if (o) { overview(o); }
    var w = document.getElementById("order");
    if (w) { order(w); }
  });
})();
