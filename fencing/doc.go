// Package fencing is fencegate's domain: fencing tokens, leases, the errors
// every component speaks, the Store interface that every backing store
// implements, and the bounds on what callers may ask for.
//
// The contract, for every resource R:
//
//   - Tokens never repeat and never go backwards. Each acquisition of R by a
//     new owner (or after the previous lease ended) gets a token above
//     issued(R): issued(R)+1 in the memory and file stores, possibly more in
//     the Valkey store, whose tokens follow its server clock. The same owner
//     re-acquiring a live lease extends it and keeps its token.
//   - A store that loses data keeps the first promise and never admits a
//     token superseded before the loss after a newer write: it detects the
//     loss and moves the affected resources past a floor above every token
//     issued before it (the file store on Open, from the host clock and a
//     marker beside its file; a new file also starts at the clock's floor;
//     the Valkey store on the acquisition or admission that finds a record
//     older than one it saw), refusing pre-loss tokens with a
//     *StaleTokenError whose BeforeLoss is set; a store that cannot
//     recover within the call returns ErrStoreLost.
//   - Admission is atomic in the store: a write with token t is admitted only
//     if high_water(R) <= t <= issued(R), and admission raises high_water(R)
//     to t in the same atomic store operation.
//   - Stores fail closed: an error that is not one of the domain's refusals
//     means the outcome is unknown and the caller must not act as if the
//     operation had succeeded.
//
// Limits: fencing orders writes only where the writer's token is checked (the
// write gate, or a store that checks it itself). It is not an authorization
// layer: tokens are not secrets.
package fencing
