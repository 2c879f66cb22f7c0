// SPEC §4.4's example: find the shipping list by search, then keep the unpaid
// shipments over 10 metric tons. With examples/catalog.json the result is
// ["SHP-1002", "SHP-1004", "SHP-1007"].
const hit = (await tools.search("shipping list"))[0];
const rows = await tools.callValue(hit.id, {});
return rows.filter(r => !r.paid && r.tons > 10).map(r => r.id);
