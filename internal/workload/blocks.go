package workload

import (
	"encoding/binary"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// BlockIDs appends to dst one identity per full block of blockTokens tokens of the
// prompt; a trailing partial block is dropped, as a model server caches only full
// blocks. Token i of segment S is mix(xxhash64(S.ID), i) and a block's id is the
// xxhash64 of its tokens' identities, so prompts that agree up to some token have
// the same leading block ids wherever their segment boundaries fall. The ids are
// not chained (equal runs of tokens give equal blocks wherever they are): callers
// chain them, as a prefix cache does.
func BlockIDs(dst []uint64, prompt []Segment, blockTokens int) []uint64 {
	if blockTokens <= 0 {
		return dst
	}
	// Token identities are staged in buf. A block that fits is hashed in one call;
	// a larger one streams through the digest a buffer at a time.
	var buf [64 * 8]byte
	var d xxhash.Digest
	streamed := false
	n, fill := 0, 0 // tokens in the current block, bytes staged in buf
	for _, s := range prompt {
		id := mix(xxhash.Sum64String(s.ID), 0)
		for left := s.Tokens; left > 0; {
			k := min(left, blockTokens-n, (len(buf)-fill)/8)
			for range k {
				binary.LittleEndian.PutUint64(buf[fill:], id)
				id += mixStep // mix(h, i+1)
				fill += 8
			}
			left -= k
			n += k
			switch {
			case n == blockTokens && !streamed:
				dst = append(dst, xxhash.Sum64(buf[:fill]))
				n, fill = 0, 0
			case n == blockTokens:
				_, _ = d.Write(buf[:fill])
				dst = append(dst, d.Sum64())
				n, fill, streamed = 0, 0, false
			case fill == len(buf):
				if !streamed {
					d.Reset()
					streamed = true
				}
				_, _ = d.Write(buf[:])
				fill = 0
			}
		}
	}
	return dst
}

// mixStep is an odd constant, so that mix is one-to-one in h + i.
const mixStep = 0x9e3779b97f4a7c15

// mix is the identity of token i of a segment whose id hashes to h. Any function
// one-to-one in h + i does, since the block hash mixes; this one lets BlockIDs step
// from one token to the next with an addition.
func mix(h uint64, i int) uint64 { return (h + uint64(i)) * mixStep }

// Text renders a prompt as English-like text of about four characters per token:
// word j of a segment is drawn from vocab by hashing (ID, j), with sentence
// breaks drawn the same way, until the segment has 4 × Tokens characters.
// Equal segments therefore render to equal text, a shorter segment of the same id
// to a prefix of a longer one's, and prompts that share leading segments to texts
// that share a prefix, which a real server's prefix cache can reuse. Segments are
// joined by a space.
func Text(prompt []Segment) string {
	n := 0
	for _, s := range prompt {
		n += max(s.Tokens, 0)
	}
	var b strings.Builder
	b.Grow(4*n + 16*len(prompt))
	for _, s := range prompt {
		if s.Tokens <= 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		h := xxhash.Sum64String(s.ID)
		end := b.Len() + 4*s.Tokens
		capital := true
		for j := 0; b.Len() < end; j++ {
			if j > 0 {
				b.WriteByte(' ')
			}
			x := scramble(mix(h, j))
			w := vocab[x%uint64(len(vocab))]
			if capital {
				b.WriteByte(w[0] - 'a' + 'A')
				w = w[1:]
			}
			b.WriteString(w)
			// Punctuation from the high bits, the word from the low: one word in
			// eight ends a sentence and one in sixteen of the others takes a comma.
			switch capital = x>>60 < 2; {
			case capital:
				b.WriteByte('.')
			case x>>56&15 == 0:
				b.WriteByte(',')
			}
		}
	}
	return b.String()
}

// scramble is murmur3's 64-bit finalizer. Text needs every bit of a word's draw
// to depend on the whole of mix's output: mix's low bits step through a fixed
// cycle from one position to the next.
func scramble(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	return x ^ x>>33
}

// vocab is Text's vocabulary, 512 common lower-case English words; read only.
var vocab = strings.Fields(`
the of and to in is was for that on with as by at from it his an be are this which
or had not but have her were one all their they she there been has more when who
would will also two can time first after into new other some him only its out up
them about then than what over these such most so may any years many made people
like just year where between could three through used because while before during
both each those under well city same world state since later known life being part
day should around work even back still down until did much another against own team
found long name high end number four country way here last take school house make
place again five without group great general among never public second early within
men off family national set use show several next government system best water small
form large play old left right music point word hand called home think along little
side area come power full often film book children few how does know need course
line want good very important every together change follow air ask light night study
question begin story problem young keep turn might read start open river history
near answer food land eye close head white thought live real order paper above run
body already present past money idea fact service sense care mind field product
model plan report level market minute moment reason table value figure center
teacher voice price energy morning woman women child student friend office party
father mother south north east west sure simple short class rest space hold given
leave bring rather less person able half across behind matter period free today
whole quite least almost nothing something press special support force record
position whether series data test case result method effect local human member sound
process enough clear upon easy list base rule cause action deal hour heard kind late
main true stand month building black red green blue brown gray bright dark warm cold
wind rain snow tree stone glass metal wood fire earth sea sky sun moon star road
street bridge garden window door wall floor room kitchen church hospital village
island forest mountain valley lake ocean desert coast harbor farm station engine
machine letter message picture language reading writing common certain single
private final recent future strong quick slow heavy clean quiet happy ready careful
similar different possible available likely useful natural physical social political
economic financial medical legal personal central regional basic major minor
specific particular total complete agree allow appear apply arrive build carry catch
choose climb collect cover create decide deliver describe design develop discover
explain finish gather grow improve include increase join judge lead learn listen
manage measure mention move notice offer pass pay plant prepare produce protect
provide reach receive reduce remain remember repeat return review save search sell
send serve share sing solve speak spend stay suggest teach travel try understand
visit wait walk watch wear win wish wonder write
`)
