// Progressive enhancement only: every page works without it. Shows each <time> in the
// viewer's time zone; the UTC value stays in its title (hover) and datetime attribute.
"use strict";
(function () {
  var format = { year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit" };
  function localize() {
    var times = document.querySelectorAll("time[datetime]");
    for (var i = 0; i < times.length; i++) {
      var when = new Date(times[i].getAttribute("datetime"));
      if (!isNaN(when.getTime())) {
        times[i].textContent = when.toLocaleString(undefined, format);
      }
    }
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", localize);
  } else {
    localize();
  }
})();
