// Parse PromQL with Prometheus' own grammar (@prometheus-io/lezer-promql, the parser behind the
// Prometheus UI's editor). Reads a JSON array of queries on stdin; writes a JSON array with, for
// each, null when it parses or the offset and text where the grammar gave up.
import { parser } from "@prometheus-io/lezer-promql";

let input = "";
for await (const chunk of process.stdin) input += chunk;

const results = JSON.parse(input).map((query) => {
  let error = null;
  parser.parse(query).iterate({
    enter: (node) => {
      if (node.type.isError && error === null) {
        error = { offset: node.from, near: query.slice(Math.max(0, node.from - 20), node.from + 20) };
      }
    },
  });
  return error;
});
process.stdout.write(JSON.stringify(results));
