// Output entries next to the return value: console.log/warn and text() append
// text entries, json() appends a JSON entry; all come back in `output`.
console.log("looking up unpaid shipments");
const rows = await tools.callValue("host:shipping:shipping_list");
const unpaid = rows.filter((r) => !r.paid);
text(`${unpaid.length} of ${rows.length} shipments are unpaid`);
json({ unpaid: unpaid.map((r) => r.id), tons: Math.round(unpaid.reduce((sum, r) => sum + r.tons, 0) * 100) / 100 });
console.warn("heaviest unpaid:", unpaid.reduce((a, b) => (b.tons > a.tons ? b : a)).id);
return unpaid.length;
