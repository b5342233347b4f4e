// The console's only script of its own (no inline script: the CSP forbids it).
// Shows every <time datetime="...Z"> in the viewer's time zone, keeping the UTC value
// in its title (hover), and tells the server the viewer's offset on forms that need it.
(function () {
  "use strict";
  var format = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short"
  });

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  function localize(root) {
    var times = (root || document).querySelectorAll("time[datetime]:not([data-local])");
    for (var i = 0; i < times.length; i++) {
      var el = times[i];
      var when = new Date(el.getAttribute("datetime"));
      if (isNaN(when.getTime())) { continue; }
      el.title = el.getAttribute("datetime") + " (UTC)";
      el.textContent = format.format(when);
      el.setAttribute("data-local", "");
    }
    // Recover's "since" is a datetime-local value: the offset turns it into UTC on the server.
    var offsets = (root || document).querySelectorAll("input.tz-offset");
    for (var j = 0; j < offsets.length; j++) {
      offsets[j].value = String(new Date().getTimezoneOffset());
    }
    // An empty "since" starts at an hour ago, in the viewer's zone.
    var since = (root || document).querySelectorAll("input[type=datetime-local][data-default-hours-ago]");
    for (var k = 0; k < since.length; k++) {
      if (since[k].value) { continue; }
      var hours = Number(since[k].getAttribute("data-default-hours-ago")) || 1;
      var t = new Date(Date.now() - hours * 3600e3);
      since[k].value = t.getFullYear() + "-" + pad(t.getMonth() + 1) + "-" + pad(t.getDate()) + "T" +
        pad(t.getHours()) + ":" + pad(t.getMinutes()) + ":" + pad(t.getSeconds());
    }
  }

  document.addEventListener("DOMContentLoaded", function () { localize(document); });
  // Fragments htmx swaps in (polled threads, new messages) hold times too.
  document.addEventListener("htmx:load", function (event) { localize(event.target); });
})();
