// kafkajs transactions against a cluster: commit 5 records, abort 3, then read the topic
// back read_committed and read_uncommitted. Prints one JSON line; exits non-zero on error.
// usage: node txn.js BOOTSTRAP TOPIC
const { Kafka, logLevel } = require('kafkajs');

const [bootstrap, topic] = process.argv.slice(2);
const kafka = new Kafka({
  clientId: 'kafkajs-txn-test',
  brokers: bootstrap.split(','),
  logLevel: logLevel.NOTHING,
  retry: { retries: 8 },
});

async function readAll(isolation, expected) {
  const consumer = kafka.consumer({
    groupId: `js-${isolation}-${Date.now()}`,
    readUncommitted: isolation === 'read_uncommitted',
  });
  const seen = [];
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  await new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, 15000); // a bounded wait: what was read by then counts
    consumer
      .run({
        eachMessage: async ({ message }) => {
          seen.push(message.value.toString());
          if (seen.length >= expected) {
            clearTimeout(timer);
            setTimeout(resolve, 1000); // anything beyond `expected` would still arrive
          }
        },
      })
      .catch(reject);
  });
  await consumer.disconnect();
  return seen.sort();
}

async function main() {
  const producer = kafka.producer({
    transactionalId: `js-${topic}`,
    idempotent: true,
    maxInFlightRequests: 1,
  });
  await producer.connect();
  let txn = await producer.transaction();
  await txn.send({ topic, messages: [0, 1, 2, 3, 4].map((i) => ({ value: `c${i}`, partition: i % 2 })) });
  await txn.commit();
  txn = await producer.transaction();
  await txn.send({ topic, messages: [0, 1, 2].map((i) => ({ value: `a${i}`, partition: i % 2 })) });
  await txn.abort();
  await producer.disconnect();
  const committed = await readAll('read_committed', 5);
  const uncommitted = await readAll('read_uncommitted', 8);
  console.log(JSON.stringify({ committed, uncommitted }));
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(`kafkajs: ${err && err.message ? err.message : err}`);
    process.exit(1);
  },
);
