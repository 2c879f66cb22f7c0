// Hands control back to the model with yield_control (the result is `waiting`),
// then continues after `wait`: asks the user through a client tool.
const quote = await tools.callValue("host:shipping:shipping_quote", {
  origin: "NLRTM",
  destination: "USNYC",
  tons: 18,
  service: "express",
});
const resumed = await yield_control(`confirm express quote ${quote.quoteId} (EUR ${quote.price})`);
const answer = await tools.callValue("client:app:confirm_action", {
  message: `Book ${quote.quoteId} for EUR ${quote.price}?`,
});
return { quote: quote.quoteId, price: quote.price, resumed: resumed.status, confirmed: answer.confirmed };
