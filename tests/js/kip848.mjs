// @platformatic/kafka's KIP-848 consumer (groupProtocol: 'consumer') reads a topic: waits for
// EXPECTED records (bounded), prints one JSON line {"read": n, "partitions": [...]}, exits
// non-zero on error or when fewer arrived. usage: node kip848.mjs BOOTSTRAP TOPIC GROUP EXPECTED
// the package wants node >= 22; Debian's node 20 lacks only Promise.withResolvers
if (!Promise.withResolvers) {
  Promise.withResolvers = () => {
    let resolve;
    let reject;
    const promise = new Promise((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { promise, resolve, reject };
  };
}
const { Consumer, stringDeserializers } = await import('@platformatic/kafka');

const [bootstrap, topic, groupId, expectedText] = process.argv.slice(2);
const expected = Number(expectedText);
const consumer = new Consumer({
  groupId,
  clientId: 'platformatic-kip848-test',
  bootstrapBrokers: bootstrap.split(','),
  deserializers: stringDeserializers,
  groupProtocol: 'consumer',
});

const seen = new Set();
const partitions = new Set();
const timer = setTimeout(() => finish(1), 60000); // a bounded wait
let stream;

async function finish(code) {
  clearTimeout(timer);
  console.log(JSON.stringify({ read: seen.size, partitions: [...partitions].sort() }));
  try {
    if (stream) await stream.close();
    await consumer.close(true);
  } catch (err) {
    console.error(String(err));
  }
  process.exit(code);
}

try {
  stream = await consumer.consume({ topics: [topic], mode: 'earliest', autocommit: true });
  stream.on('data', (message) => {
    seen.add(`${message.partition}/${message.offset}`);
    partitions.add(message.partition);
    if (seen.size >= expected) finish(0);
  });
  stream.on('error', (err) => {
    console.error(String(err));
    finish(2);
  });
} catch (err) {
  console.error(String(err));
  finish(3);
}
