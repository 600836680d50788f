// Live progress on the running page: one server-sent event stream for the jobs shown
// (aqw/dashboard/_live.py) moves each row's bar, percentage and message as the job reports
// them, and marks a row whose job has ended. Without it the page shows what it loaded.
(function () {
  "use strict";
  var table = document.getElementById("running");
  if (!table || !window.EventSource) return;
  var rows = {};
  var query = [];
  table.querySelectorAll("tr[data-job]").forEach(function (row) {
    var id = row.getAttribute("data-job");
    rows[id] = row;
    query.push("job=" + encodeURIComponent(id));
  });
  if (!query.length) return;
  var source = new EventSource(table.getAttribute("data-live") + "?" + query.join("&"));
  source.addEventListener("progress", function (event) {
    var update = JSON.parse(event.data);
    var row = rows[update.job_id];
    if (!row) return;
    if (typeof update.fraction === "number") {
      row.querySelector("progress").value = update.fraction;
      row.querySelector(".pct").textContent = Math.round(update.fraction * 100) + "%";
    }
    var message = row.querySelector(".msg");
    message.textContent = update.message || "";
    message.title = update.message || "";
    if (update.state) row.setAttribute("data-state", update.state);
  });
  source.addEventListener("end", function () {
    source.close(); // every job shown has ended: nothing more comes
  });
})();
