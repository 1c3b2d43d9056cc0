// @effectgate/client: the runner API of Effectgate, typed, and a Runner that calls a
// side-effecting tool at most once. The parts land module by module; this file
// re-exports them.
export const API_VERSION = "1";
