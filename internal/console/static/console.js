// toolsvc console: progressive enhancement. Without this script every page
// works; with it, pending approvals appear and leave without a reload, an
// open approval says when it changed elsewhere, and expiries count down.
(function () {
  "use strict";

  function announce(text) {
    var el = document.getElementById("live-status");
    if (el) { el.textContent = text; }
  }

  function countdowns() {
    var now = Date.now();
    document.querySelectorAll("time[data-countdown]").forEach(function (el) {
      var left = Math.round((Date.parse(el.dataset.countdown) - now) / 1000);
      if (isNaN(left)) { return; }
      var abs = Math.abs(left), h = Math.floor(abs / 3600), m = Math.floor(abs % 3600 / 60), s = abs % 60;
      var text = h > 0 ? h + "h" + String(m).padStart(2, "0") + "m" : m > 0 ? m + "m" + String(s).padStart(2, "0") + "s" : s + "s";
      el.textContent = left >= 0 ? "in " + text : "expired " + text + " ago";
    });
  }

  function listen(onChange) {
    if (!window.EventSource) { return; }
    var es = new EventSource("/events");
    es.addEventListener("approvals", function (e) { onChange(e.data); });
    es.addEventListener("signedout", function () { es.close(); announce("You were signed out. Reload to sign in again."); });
  }

  var list = document.getElementById("approval-list");
  if (list && list.dataset.live) {
    var timer = null, busy = false, again = false;
    var refresh = function () {
      if (busy) { again = true; return; }
      // Never pull the list out from under someone working in it.
      if (list.contains(document.activeElement) && document.activeElement !== list) {
        announce("The pending approvals changed. Leave the list to update it.");
        again = true;
        return;
      }
      busy = true;
      fetch(list.dataset.src, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) {
          var before = list.querySelectorAll("[data-approval]").length;
          list.innerHTML = html;
          var after = list.querySelectorAll("[data-approval]").length;
          if (after !== before) { announce(after + " pending approval" + (after === 1 ? "" : "s") + "."); }
          countdowns();
        })
        .catch(function () { announce("Could not update the list; reload the page."); })
        .finally(function () { busy = false; if (again) { again = false; schedule(); } });
    };
    var schedule = function () { clearTimeout(timer); timer = setTimeout(refresh, 150); };
    list.addEventListener("focusout", function () { if (again) { again = false; schedule(); } });
    listen(schedule);
  }

  var card = document.querySelector("article[data-approval]");
  if (card) {
    listen(function (id) {
      if (id === "" || id === card.dataset.approval) {
        fetch(location.pathname, { credentials: "same-origin" }).then(function (r) { return r.text(); }).then(function (html) {
          var doc = new DOMParser().parseFromString(html, "text/html");
          var fresh = doc.querySelector("article[data-approval]");
          if (fresh && fresh.dataset.state !== card.dataset.state) {
            announce("This approval is now " + fresh.dataset.state + ". Reload to see it.");
          }
        });
      }
    });
  }

  countdowns();
  setInterval(countdowns, 1000);
})();
