// Tool refusals are rejected promises the program can catch: cancelling a paid
// shipment is `blocked` by policy, an unpaid one succeeds.
const results = [];
for (const shipmentId of ["SHP-1001", "SHP-1003"]) {
  try {
    const r = await tools.callValue("host:shipping:shipping_cancel", { shipmentId, reason: "duplicate booking" });
    results.push({ shipmentId, cancelled: r.cancelled });
  } catch (err) {
    results.push({ shipmentId, error: err.message });
  }
}
return results;
